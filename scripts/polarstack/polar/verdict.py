"""The verdict of Polar's pipeline on one answer (polar.model) and the findings on it (polar.findings): its outcome
names, the int64 bounds of slime's token tensors, and the records both modules fill."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

TRAINABLE = "trainable"
RETOKENIZED = "retokenized"  # trainable only through Polar's re-tokenization of text
NOT_TRAINABLE = "not_trainable"
UNPARSEABLE = "unparseable"  # orjson rejects the body: the request fails, nothing is recorded

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


@dataclass
class Finding:
    code: str  # usage_mismatch | positive_logprob | nonfinite_logprob | coerced_id | id_beyond_64_bits | negative_id | ...
    path: str
    message: str  # what was seen and what it means for training

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class PolarVerdict:
    verdict: str = NOT_TRAINABLE
    stage: str = ""  # the step that ended the record: parse | normalize | trace | adapter | "" (kept)
    reason: str = ""  # why Polar extracts nothing (empty when trainable)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    trainable_tokens: int = 0
    retokenized: list[str] = field(default_factory=list)  # "prompt" / "response" rebuilt from text
    warnings: list[Finding] = field(default_factory=list)
    response: dict[str, Any] | None = None  # the parsed body (before normalization), when parsing succeeded

    def as_dict(self) -> dict[str, Any]:
        return {
            "polar_verdict": self.verdict,
            "polar_trainable_tokens": self.trainable_tokens,
            "polar_stage": self.stage,
            "polar_reason": self.reason,
            "retokenized": self.retokenized,
            "warnings": [w.as_dict() for w in self.warnings],
        }
