"""The diagnostics of one engine answer: every precise reason Polar cannot train on it (which token field is
missing, which request flag the path dropped, which invariant breaks), for the smoke, the probe and the bench.

It reads the answer through polar.model's one reading of Polar's SGLangEngine.normalize_response, guarded
(`normalize_guarded`, `GUARDED_COERCION_ERRORS`) so that `diagnose` never raises on any JSON value, then takes
the ids as record_utils.build_trace_from_completion does (polar.model's coercions): prompt ids are the first
non-empty of `choices[0].input_token_ids`, `choices[0].prompt_token_ids`, top-level `prompt_token_ids`; response
ids come from `token_ids` (logprobs from an aligned candidate), else `logprobs.content[]` items carrying both
`token_id` and `logprob`, else `meta_info.output_token_logprobs`. The slime bridge drops a trace with empty
prompt or response ids and raises RolloutLogprobError on missing or misaligned logprobs.

Polar's count (the go/no-go) is polar.model.decide's; these problems only name what is missing or inconsistent.
`sglext.input_ids` / `sglext.output_ids` (sglang after 0.5.15) are recognised and reported, but not counted,
since the pinned Polar does not read them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from polarstack.polar import model as polar_model

MISSING = "missing"  # a token field is absent: nothing to train on
INVARIANT = "invariant"  # token fields present but inconsistent
WARNING = "warning"  # suspicious but not fatal (multi-turn template divergence, ...)

GUARDED = polar_model.GUARDED_COERCION_ERRORS


@dataclass
class Problem:
    kind: str  # MISSING | INVARIANT | WARNING
    field: str  # the JSON path concerned
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Diagnosis:
    """What Polar could train on from one answer, and every reason it cannot (`as_dict()`: the smoke's `verdict`)."""

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_source: str | None = None
    response_source: str | None = None
    logprobs_source: str | None = None
    choice_keys: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def missing(self) -> list[Problem]:
        return [p for p in self.problems if p.kind == MISSING]

    @property
    def violations(self) -> list[Problem]:
        return [p for p in self.problems if p.kind == INVARIANT]

    @property
    def usable(self) -> bool:
        """Would the slime bridge keep this trace and train on it?"""
        return bool(self.prompt_ids) and bool(self.response_ids) and not self.missing and not self.violations

    @property
    def trainable_tokens(self) -> int:
        """Loss-mask ones of the trace (all response tokens for a single-completion trace)."""
        return len(self.response_ids) if self.usable else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "trainable_tokens": self.trainable_tokens,
            "prompt_tokens": len(self.prompt_ids),
            "response_tokens": len(self.response_ids),
            "prompt_source": self.prompt_source,
            "response_source": self.response_source,
            "logprobs_source": self.logprobs_source,
            "choice_keys": self.choice_keys,
            "problems": [p.as_dict() for p in self.problems],
        }


def _describe_absent_prompt(raw_choice: dict[str, Any], raw: dict[str, Any]) -> str:
    keys = ("input_token_ids", "prompt_token_ids")
    present = [k for k in keys if k in raw_choice] + (
        ["prompt_token_ids (top level)"] if "prompt_token_ids" in raw else []
    )
    if present:
        return f"prompt token ids are empty or not a list ({', '.join(present)} present but unusable)"
    return (
        "prompt token ids absent: choices[0] has no prompt_token_ids or input_token_ids and the response "
        "has no top-level prompt_token_ids (the engine adds them only when the request carries "
        "return_prompt_token_ids)"
    )


def _describe_absent_response(raw_choice: dict[str, Any]) -> list[str]:
    reasons: list[str] = []
    meta = raw_choice.get("meta_info")
    if meta is None:
        reasons.append(
            "choices[0].meta_info absent (the engine adds it only when the request carries return_meta_info)"
        )
    elif not isinstance(meta, dict):
        reasons.append("choices[0].meta_info is not an object")
    else:
        entries = meta.get("output_token_logprobs")
        if entries is None:
            reasons.append("choices[0].meta_info has no output_token_logprobs (the request needs logprobs: true)")
        elif not isinstance(entries, list) or not entries:
            reasons.append("choices[0].meta_info.output_token_logprobs is empty or not a list")
        else:
            for index, item in enumerate(entries):
                token_id, logprob, _token = polar_model.meta_entry(item)
                if polar_model.id_and_logprob(token_id, logprob, GUARDED) is None:
                    reasons.append(
                        f"choices[0].meta_info.output_token_logprobs[{index}] lacks a usable "
                        "token id or logprob, which invalidates the whole list"
                    )
                    break
    if "token_ids" not in raw_choice:
        reasons.append("choices[0].token_ids absent")
    logprobs = raw_choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        reasons.append("choices[0].logprobs.content absent or empty")
    elif not all(isinstance(item, dict) and item.get("token_id") is not None for item in content):
        reasons.append("choices[0].logprobs.content[] items carry no token_id (plain sglang never adds one)")
    return reasons


def diagnose(response: Any) -> Diagnosis:
    """Everything Polar could train on from one chat-completions response, and every reason it cannot."""
    verdict = Diagnosis()
    problems = verdict.problems
    if not isinstance(response, dict):
        problems.append(Problem(MISSING, "$", f"response body is {type(response).__name__}, not a JSON object"))
        return verdict
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        problems.append(Problem(MISSING, "choices", "response has no choices[0] object"))
        return verdict
    raw_choice = choices[0]
    verdict.choice_keys = sorted(str(k) for k in raw_choice)

    normalized = polar_model.normalize_guarded(response)
    choice = normalized["choices"][0]

    # Prompt ids: the first non-empty of the three places (record_utils uses `or`).
    for source, value in (
        ("choices[0].input_token_ids", choice.get("input_token_ids")),
        ("choices[0].prompt_token_ids", choice.get("prompt_token_ids")),
        ("prompt_token_ids", normalized.get("prompt_token_ids")),
    ):
        if value:
            if isinstance(value, list):
                verdict.prompt_source = source
                bad = next(((i, v) for i, v in enumerate(value) if type(v) is not int), None)
                if bad is not None:
                    problems.append(
                        Problem(INVARIANT, f"{source}[{bad[0]}]", f"{source}[{bad[0]}] is {bad[1]!r}, not an int")
                    )
                    verdict.prompt_ids = []
                else:
                    verdict.prompt_ids = list(value)
            break
    if verdict.prompt_source is None:
        problems.append(Problem(MISSING, "choices[0].prompt_token_ids", _describe_absent_prompt(raw_choice, response)))

    # Response ids and logprobs (record_utils._extract_response_tokens).
    token_ids = choice.get("token_ids", normalized.get("token_ids"))
    response_ids = polar_model.coerce_int_list(token_ids, GUARDED)
    candidates = (
        ("choices[0].logprobs.content", polar_model.content_pairs(choice, GUARDED)),
        ("choices[0].meta_info.output_token_logprobs", polar_model.meta_pairs(choice, GUARDED)),
    )
    source_of_ids = (
        "choices[0].meta_info.output_token_logprobs"
        if polar_model.meta_pairs(raw_choice, GUARDED)
        else "choices[0].token_ids"
    )
    if response_ids is not None:
        verdict.response_ids = response_ids
        verdict.response_source = source_of_ids
        for name, pair in candidates:
            if pair is not None and pair[0] == response_ids:
                verdict.logprobs, verdict.logprobs_source = pair[1], name
                break
    else:
        for name, pair in candidates:
            if pair is not None:
                verdict.response_ids, verdict.logprobs = pair
                verdict.response_source = verdict.logprobs_source = name
                break
    if verdict.response_source is None or not verdict.response_ids:
        for reason in _describe_absent_response(raw_choice):
            problems.append(Problem(MISSING, "choices[0]", reason))
        if verdict.response_source is not None:
            problems.append(Problem(MISSING, verdict.response_source, f"{verdict.response_source} is empty"))

    # sglext (sglang after 0.5.15): recognised, not read by the pinned Polar.
    sglext = response.get("sglext")
    if isinstance(sglext, dict) and (sglext.get("input_ids") or sglext.get("output_ids")) and verdict.missing:
        problems.append(
            Problem(
                WARNING,
                "sglext",
                "token ids are present in sglext.input_ids/output_ids, which "
                "the pinned Polar does not read; they do not count as trainable",
            )
        )

    _check_invariants(verdict, response)
    return verdict


def _check_invariants(verdict: Diagnosis, response: dict[str, Any]) -> None:
    problems = verdict.problems
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
    if verdict.prompt_ids and usage is not None and "prompt_tokens" in usage:
        expected = usage.get("prompt_tokens")
        if type(expected) is int and expected != len(verdict.prompt_ids):
            problems.append(
                Problem(
                    INVARIANT,
                    verdict.prompt_source or "prompt",
                    f"{len(verdict.prompt_ids)} prompt token ids but usage.prompt_tokens is {expected}",
                )
            )
    if verdict.response_ids:
        if (
            usage is not None
            and type(usage.get("completion_tokens")) is int
            and usage["completion_tokens"] != len(verdict.response_ids)
        ):
            problems.append(
                Problem(
                    INVARIANT,
                    verdict.response_source or "response",
                    f"{len(verdict.response_ids)} response token ids but usage.completion_tokens "
                    f"is {usage['completion_tokens']}",
                )
            )
        if verdict.logprobs is None:
            problems.append(
                Problem(
                    INVARIANT,
                    "logprobs",
                    "response token ids have no aligned logprobs "
                    "(slime's bridge raises RolloutLogprobError and drops the group)",
                )
            )
        else:
            if len(verdict.logprobs) != len(verdict.response_ids):
                problems.append(
                    Problem(
                        INVARIANT,
                        verdict.logprobs_source or "logprobs",
                        f"{len(verdict.logprobs)} logprobs for {len(verdict.response_ids)} response ids",
                    )
                )
            for index, value in enumerate(verdict.logprobs):
                if not math.isfinite(value):
                    problems.append(
                        Problem(
                            INVARIANT, f"{verdict.logprobs_source}[{index}]", f"logprob {index} is {value}, not finite"
                        )
                    )
                    break
                if value > 0:
                    problems.append(
                        Problem(
                            INVARIANT, f"{verdict.logprobs_source}[{index}]", f"logprob {index} is {value}, above 0"
                        )
                    )
                    break


def check_prefix(previous_prompt: list[int], prompt: list[int]) -> Problem | None:
    """A follow-up turn's prompt should extend the previous turn's (templates are not always append-only)."""
    if not previous_prompt or not prompt:
        return None
    for index, (a, b) in enumerate(zip(previous_prompt, prompt, strict=False)):
        if a != b:
            return Problem(
                WARNING,
                "multi-turn",
                f"follow-up prompt diverges from the previous turn's prompt at "
                f"token {index} ({a} != {b}); prefix-merging builders will split the trace",
            )
    if len(prompt) < len(previous_prompt):
        return Problem(
            WARNING,
            "multi-turn",
            f"follow-up prompt ({len(prompt)} tokens) is shorter than the previous turn's ({len(previous_prompt)})",
        )
    return None
