"""Polar's token contract: the request it sends to SGLang and what it can train on from the response.

Behaviour matched (read, not copied) from NVIDIA-NeMo/ProRL-Agent-Server:
- `src/polar/gateway/engine.py`, `SGLangEngine.prepare_request` / `normalize_response`: the request adds
  `logprobs`, `return_prompt_token_ids`, `return_meta_info` (and `proxy.py` forces `stream: false`); the
  response's `prompt_token_ids` is copied to `input_token_ids` and `meta_info.output_token_logprobs` becomes
  `token_ids` plus `logprobs.content[].token_id`, all-or-nothing.
- `src/polar/trajectory/record_utils.py`, `build_trace_from_completion`: prompt ids are the first non-empty of
  `choices[0].input_token_ids`, `choices[0].prompt_token_ids`, top-level `prompt_token_ids`; response ids come
  from `token_ids` (logprobs from an aligned candidate), else `logprobs.content[]` items carrying both
  `token_id` and `logprob`, else `meta_info.output_token_logprobs`; `loss_mask = [1] * len(response_ids)`.
- slime bridge: a trace with empty prompt or response ids is dropped; logprobs missing or of another length
  than the response ids raise RolloutLogprobError.

`analyze_response` never raises: any JSON value yields a `ResponseVerdict` listing every precise reason
the response cannot be trained on. `sglext.input_ids` / `sglext.output_ids` (sglang after 0.5.15) are
recognised and reported, but not counted, since the pinned Polar does not read them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

# The request fields Polar's SGLangEngine adds (names matter: routers drop exactly these).
POLAR_REQUEST_FLAGS = ("return_prompt_token_ids", "return_meta_info")

MISSING = "missing"  # a token field is absent: nothing to train on
INVARIANT = "invariant"  # token fields present but inconsistent
WARNING = "warning"  # suspicious but not fatal (multi-turn template divergence, ...)


def prepare_request(request: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of an OpenAI chat request shaped as Polar's gateway sends it to SGLang."""
    shaped = copy.deepcopy(request)
    shaped.pop("stream", None)
    shaped["stream"] = False  # proxy.py InferenceClient._completion
    shaped["logprobs"] = True  # InferenceEngine.prepare_request
    for flag in POLAR_REQUEST_FLAGS:  # SGLangEngine.prepare_request
        shaped[flag] = True
    return shaped


@dataclass
class Problem:
    kind: str  # MISSING | INVARIANT | WARNING
    field: str  # the JSON path concerned
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class ResponseVerdict:
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


# --- helpers that mirror Polar's coercions, never raising ---------------------------------------------


def _to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _to_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _int_list(value: Any) -> list[int] | None:
    """record_utils._coerce_int_list: every element through int(), or None."""
    if not isinstance(value, list):
        return None
    out: list[int] = []
    for item in value:
        number = _to_int(item)
        if number is None:
            return None
        out.append(number)
    return out


def _pairs_from_content(choice: dict[str, Any]) -> tuple[list[int], list[float]] | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    ids: list[int] = []
    lps: list[float] = []
    for item in content:
        if not isinstance(item, dict) or item.get("token_id") is None or item.get("logprob") is None:
            return None
        tid, lp = _to_int(item["token_id"]), _to_float(item["logprob"])
        if tid is None or lp is None:
            return None
        ids.append(tid)
        lps.append(lp)
    return ids, lps


def _pairs_from_meta(choice: dict[str, Any]) -> tuple[list[int], list[float]] | None:
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    ids: list[int] = []
    lps: list[float] = []
    for item in entries:
        tid = lp = None
        if isinstance(item, (list, tuple)) and len(item) >= 2:
            lp, tid = item[0], item[1]
        elif isinstance(item, dict):
            tid = item.get("token_id")
            lp = item.get("logprob", item.get("token_logprob"))
        if tid is None or lp is None:
            return None
        tid_i, lp_f = _to_int(tid), _to_float(lp)
        if tid_i is None or lp_f is None:
            return None
        ids.append(tid_i)
        lps.append(lp_f)
    return ids, lps


def normalize_sglang(response: dict[str, Any]) -> dict[str, Any]:
    """Polar's SGLangEngine.normalize_response on a copy (the meta_info payload is dropped after use)."""
    response = copy.deepcopy(response)
    choices = response.get("choices")
    if not isinstance(choices, list):
        return response
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("input_token_ids") is None and isinstance(choice.get("prompt_token_ids"), list):
            choice["input_token_ids"] = list(choice["prompt_token_ids"])
        pairs = _pairs_from_meta(choice)
        if pairs is not None:
            ids, lps = pairs
            choice["token_ids"] = ids
            meta_entries = choice["meta_info"]["output_token_logprobs"]
            canonical = []
            for tid, lp, raw in zip(ids, lps, meta_entries, strict=False):
                entry: dict[str, Any] = {"token_id": tid, "logprob": lp}
                token = (
                    raw[2]
                    if isinstance(raw, (list, tuple)) and len(raw) >= 3
                    else (raw.get("token") if isinstance(raw, dict) else None)
                )
                if token is not None:
                    entry["token"] = str(token)
                canonical.append(entry)
            logprobs = choice.get("logprobs")
            if not isinstance(logprobs, dict):
                logprobs = {}
                choice["logprobs"] = logprobs
            content = logprobs.get("content")
            if isinstance(content, list) and len(content) == len(canonical):
                logprobs["content"] = [
                    {**(old if isinstance(old, dict) else {}), **new}
                    for old, new in zip(content, canonical, strict=False)
                ]
            else:
                logprobs["content"] = canonical
        # InferenceEngine._stamp_token_ids_onto_logprobs
        token_ids, logprobs = choice.get("token_ids"), choice.get("logprobs")
        if isinstance(token_ids, list) and isinstance(logprobs, dict):
            content = logprobs.get("content")
            if isinstance(content, list) and len(content) == len(token_ids):
                for entry, tid in zip(content, token_ids, strict=False):
                    if isinstance(entry, dict):
                        entry.setdefault("token_id", tid)
        choice.pop("meta_info", None)
    return response


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
                ok = False
                if isinstance(item, (list, tuple)) and len(item) >= 2:
                    ok = _to_int(item[1]) is not None and _to_float(item[0]) is not None and None not in item[:2]
                elif isinstance(item, dict):
                    lp = item.get("logprob", item.get("token_logprob"))
                    ok = (
                        item.get("token_id") is not None
                        and lp is not None
                        and _to_int(item["token_id"]) is not None
                        and _to_float(lp) is not None
                    )
                if not ok:
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


def analyze_response(response: Any) -> ResponseVerdict:
    """Everything Polar could train on from one chat-completions response, and every reason it cannot."""
    verdict = ResponseVerdict()
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

    normalized = normalize_sglang(response)
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
    response_ids = _int_list(token_ids)
    candidates = (
        ("choices[0].logprobs.content", _pairs_from_content(choice)),
        ("choices[0].meta_info.output_token_logprobs", _pairs_from_meta(choice)),
    )
    source_of_ids = (
        "choices[0].meta_info.output_token_logprobs" if _pairs_from_meta(raw_choice) else "choices[0].token_ids"
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


def _check_invariants(verdict: ResponseVerdict, response: dict[str, Any]) -> None:
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
