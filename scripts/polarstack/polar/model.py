"""Polar's own decision, step by step: from the engine's raw answer bytes to the trainable-token count.

Each step mirrors (reads, never copies) one function of NVIDIA-NeMo/ProRL-Agent-Server. Revisions read:
POLAR_COMMIT (configs/pins.env) for src/polar/gateway/proxy.py and src/polar/gateway/engine.py and
src/slime_bridge/rollout.py; the code store holds no copy at the pin of the files below, so they follow the
nearest stored revision, named where used:
- src/polar/trajectory/builder/record_utils.py and prefix_merging.py: revision 93a0f757 (it has the optional
  tokenizer / `tokenizer_name_or_path` re-tokenization path; whether the pin has it is NOT verified);
- src/polar/trajectory/models.py (Trace): revision 467f2ab2; src/slime_bridge/adapter.py: revision 063c9482.

Pipeline (one completion = one single-completion chain, as PrefixMergingBuilder builds for the smoke's requests):
  1. parse      proxy.py InferenceClient._completion: `orjson.loads(resp.content)`; any JSONDecodeError fails
                the agent's request and nothing is recorded.
  2. normalize  engine.py SGLangEngine.normalize_response (in place): a non-object body raises there. The one
                reading of it (`normalize`); polar.diagnostics reads through its never-raising form.
  3. record     gateway/storage.py SessionStore.save_message: the normalized dict is kept as is.
  4. trace      record_utils.build_trace_from_completion (+ _extract_response_tokens, optional re-tokenization),
                then the pydantic Trace model (lax `list[int]` coercion; a ValidationError fails the build).
  5. adapter    slime_bridge/adapter.py _build_sample: empty prompt/response ids -> dropped; missing logprobs
                for trainable tokens -> RolloutLogprobError; max_tokens causal-prefix clipping.
  6. count      rollout.py `_has_trainable_tokens`: the non-zero loss-mask entries of the kept samples.
  7. deliver    gateway/node.py GatewayNodeManager._push_result (POLAR_COMMIT): the session result goes to the
                rollout server as `result.model_dump(mode="json")` through httpx `json=`, i.e. json.dumps with
                allow_nan=False; a non-finite float in the trace (a logprob such as the string "nan", which
                float() accepts) raises "Out of range float values are not JSON compliant", _push_result logs it
                and gives up, and the result never reaches the trainer.

Findings Polar does not enforce are returned as warnings with their meaning; they never change the count.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from polarstack.polar.findings import findings
from polarstack.polar.verdict import (
    RETOKENIZED,
    TRAINABLE,
    UNPARSEABLE,
    PolarVerdict,
)


class _TraceIds(BaseModel):
    """The id fields of polar/trajectory/models.py `Trace` (pydantic `list[int]`, lax mode)."""

    prompt_ids: list[int]
    response_ids: list[int]


# --- step 1: parse ------------------------------------------------------------------------------------------


def parse(body: bytes) -> tuple[Any, str | None]:
    """proxy.py InferenceClient._completion: orjson.loads on the raw bytes (NaN/Infinity literals, numbers that
    overflow a double, a BOM, non-UTF-8 such as UTF-16, lone surrogates and control characters are rejected)."""
    try:
        return orjson.loads(body), None
    except orjson.JSONDecodeError as exc:
        return None, str(exc)


# --- step 2: normalize (engine.py SGLangEngine.normalize_response) -----------------------------------------


# What engine.py and record_utils.py catch around int() / float(); anything else propagates out of Polar's code.
POLAR_COERCION_ERRORS: tuple[type[Exception], ...] = (TypeError, ValueError)
# The never-raise guard: int(inf) and float() of an integer beyond a double raise OverflowError in Polar, which
# the guarded reading counts as one more unconvertible value (orjson never yields such numbers; json.loads does).
GUARDED_COERCION_ERRORS: tuple[type[Exception], ...] = (*POLAR_COERCION_ERRORS, OverflowError)


def id_and_logprob(token_id: Any, logprob: Any, errors: tuple[type[Exception], ...]) -> tuple[int, float] | None:
    """The pair coercion engine.py and record_utils.py share: None when either is missing or unconvertible."""
    if token_id is None or logprob is None:
        return None
    try:
        return int(token_id), float(logprob)
    except errors:
        return None


def meta_entry(item: Any) -> tuple[Any, Any, Any]:
    """One meta_info.output_token_logprobs entry as (token_id, logprob, token): a [logprob, id, token?] sequence
    or a {token_id, logprob | token_logprob, token} object; (None, None, None) for anything else."""
    if isinstance(item, (list, tuple)) and len(item) >= 2:
        return item[1], item[0], item[2] if len(item) >= 3 else None
    if isinstance(item, dict):
        return item.get("token_id"), item.get("logprob", item.get("token_logprob")), item.get("token")
    return None, None, None


def _meta_pairs(
    choice: dict[str, Any], errors: tuple[type[Exception], ...]
) -> tuple[list[int], list[dict[str, Any]]] | None:
    """SGLangEngine._canonicalize_response_token_ids: all-or-nothing over meta_info.output_token_logprobs."""
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    ids: list[int] = []
    canonical: list[dict[str, Any]] = []
    for item in entries:
        token_id, logprob, token = meta_entry(item)
        pair = id_and_logprob(token_id, logprob, errors)
        if pair is None:
            return None
        ids.append(pair[0])
        entry: dict[str, Any] = {"token_id": pair[0], "logprob": pair[1]}
        if token is not None:
            entry["token"] = str(token)
        canonical.append(entry)
    return ids, canonical


def _normalize(response: dict[str, Any], errors: tuple[type[Exception], ...]) -> dict[str, Any]:
    response = copy.deepcopy(response)
    response.pop("_polar_inference_timings", None)  # POLAR_INFERENCE_TIMINGS_KEY
    choices = response.get("choices")
    if not isinstance(choices, list):
        return response
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        # _canonicalize_prompt_token_ids
        if choice.get("input_token_ids") is None and isinstance(choice.get("prompt_token_ids"), list):
            choice["input_token_ids"] = list(choice["prompt_token_ids"])
        # _canonicalize_response_token_ids
        pairs = _meta_pairs(choice, errors)
        if pairs is not None:
            choice["token_ids"], canonical = pairs
            logprobs = choice.get("logprobs")
            if not isinstance(logprobs, dict):
                logprobs = choice["logprobs"] = {}
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
        # _extract_inference_timing is not rebuilt: the timings it hands off under POLAR_INFERENCE_TIMINGS_KEY are
        # stripped by the server before storage and read by nothing downstream (its float() of timing fields
        # raises only on an integer beyond a double, which orjson never yields).
        choice.pop("meta_info", None)
    return response


def normalize(response: dict[str, Any]) -> dict[str, Any]:
    """SGLangEngine.normalize_response on a copy: prompt ids canonicalized, meta_info turned into token_ids and
    logprobs.content[], token ids stamped onto same-length content, meta_info removed. Raises where Polar's does
    (OverflowError on an infinite token id or a logprob integer beyond a double): Polar's pipeline (`decide`)."""
    return _normalize(response, POLAR_COERCION_ERRORS)


def normalize_guarded(response: Any) -> dict[str, Any] | None:
    """The same reading, never raising on any JSON value (NaN and infinities included), for the diagnostics
    (polar.diagnostics): None for a body that is not an object (Polar's normalize_response raises on it); a
    coercion Polar would raise on (GUARDED_COERCION_ERRORS) leaves the value unconverted, as TypeError does."""
    if not isinstance(response, dict):
        return None
    return _normalize(response, GUARDED_COERCION_ERRORS)


# --- step 4: trace (record_utils.build_trace_from_completion at 93a0f757) ----------------------------------


def coerce_int_list(value: Any, errors: tuple[type[Exception], ...] = POLAR_COERCION_ERRORS) -> list[int] | None:
    """record_utils._coerce_int_list: int() of every element (TypeError/ValueError -> None)."""
    if not isinstance(value, list):
        return None
    out: list[int] = []
    for item in value:
        try:
            out.append(int(item))
        except errors:
            return None
    return out


def _pairs(items: Any, key_id: str, errors: tuple[type[Exception], ...]) -> tuple[list[int], list[float]] | None:
    ids: list[int] = []
    lps: list[float] = []
    for item in items:
        if key_id == "content":  # _paired_tokens_from_logprobs_content
            if not isinstance(item, dict):
                return None
            token_id, logprob = item.get("token_id"), item.get("logprob")
        else:  # _paired_tokens_from_sglang_meta
            token_id, logprob, _token = meta_entry(item)
        pair = id_and_logprob(token_id, logprob, errors)
        if pair is None:
            return None
        ids.append(pair[0])
        lps.append(pair[1])
    return ids, lps


def content_pairs(
    choice: dict[str, Any], errors: tuple[type[Exception], ...] = POLAR_COERCION_ERRORS
) -> tuple[list[int], list[float]] | None:
    """record_utils._paired_tokens_from_logprobs_content: (ids, logprobs) of a non-empty logprobs.content[]."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return _pairs(content, "content", errors) if isinstance(content, list) and content else None


def meta_pairs(
    choice: dict[str, Any], errors: tuple[type[Exception], ...] = POLAR_COERCION_ERRORS
) -> tuple[list[int], list[float]] | None:
    """record_utils._paired_tokens_from_sglang_meta: (ids, logprobs) of a non-empty meta_info list."""
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    return _pairs(entries, "meta", errors) if isinstance(entries, list) and entries else None


def _candidates(choice: dict[str, Any]) -> list[tuple[list[int], list[float]] | None]:
    return [content_pairs(choice), meta_pairs(choice)]


def _usage_count(response: dict[str, Any], key: str) -> int | None:
    """record_utils._usage_token_count."""
    usage = response.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _reconstruct_response(response: dict[str, Any], choice: dict[str, Any], tokenizer: Any):
    """record_utils._reconstruct_response_tokens: re-encode the joined `logprobs.content[].token` text."""
    if tokenizer is None:
        return None
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    pieces: list[str] = []
    lps: list[float] = []
    for item in content:
        if not isinstance(item, dict) or not isinstance(item.get("token"), str):
            return None
        try:
            lps.append(float(item["logprob"]))
        except (KeyError, TypeError, ValueError):
            return None
        pieces.append(item["token"])
    ids = coerce_int_list(_encoding_ids(tokenizer.encode("".join(pieces), add_special_tokens=False)))
    if ids is None or len(ids) != len(lps):
        return None
    expected = _usage_count(response, "completion_tokens")  # with n >= 2 sglang sums over choices
    if expected is not None and expected != len(ids):
        return None
    return ids, lps


def _reconstruct_prompt(request: dict[str, Any], response: dict[str, Any], tokenizer: Any) -> list[int]:
    """record_utils._reconstruct_prompt_tokens: apply the chat template to the recorded request."""
    messages = request.get("messages")
    if tokenizer is None or not isinstance(messages, list):
        return []
    kwargs = request.get("chat_template_kwargs")
    tools = request.get("tools")
    try:
        encoded = tokenizer.apply_chat_template(
            messages,
            tools=tools if isinstance(tools, list) and tools else None,
            tokenize=True,
            add_generation_prompt=True,
            **(dict(kwargs) if isinstance(kwargs, dict) else {}),
        )
    except (TypeError, ValueError):
        return []
    ids = coerce_int_list(_encoding_ids(encoded))
    expected = _usage_count(response, "prompt_tokens")
    if ids is None or (expected is not None and expected != len(ids)):
        return []
    return ids


def _encoding_ids(encoded: Any) -> Any:
    """record_utils._token_ids_from_encoding: a mapping's input_ids, else the value itself."""
    return encoded.get("input_ids") if isinstance(encoded, dict) else encoded


def build_trace(response: dict[str, Any], request: dict[str, Any], tokenizer: Any, verdict: PolarVerdict) -> bool:
    """build_trace_from_completion + Trace validation; fills the verdict's ids; False when the build raises."""
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    prompt = first.get("input_token_ids") or first.get("prompt_token_ids") or response.get("prompt_token_ids")
    if not isinstance(prompt, list):
        prompt = _reconstruct_prompt(request, response, tokenizer)
        if prompt:
            verdict.retokenized.append("prompt")
    # _extract_response_tokens
    ids = coerce_int_list(first.get("token_ids", response.get("token_ids")))
    logprobs: list[float] | None = None
    candidates = _candidates(first)
    if ids is not None:  # token_ids win; logprobs only from a candidate whose ids are exactly these
        for pair in candidates:
            if pair is not None and pair[0] == ids:
                logprobs = pair[1]
                break
    else:
        pair = next((p for p in candidates if p is not None), None)
        if pair is None:
            pair = _reconstruct_response(response, first, tokenizer)
            if pair is not None:
                verdict.retokenized.append("response")
        ids, logprobs = pair if pair is not None else ([], None)
    try:  # Trace(prompt_ids=list(prompt_ids), response_ids=..., loss_mask=[1] * len(response_ids), ...)
        checked = _TraceIds(prompt_ids=list(prompt), response_ids=ids)
    except ValidationError as exc:
        first_error = exc.errors()[0]
        where = ".".join(str(p) for p in first_error.get("loc", ()))
        verdict.stage, verdict.reason = (
            "trace",
            (f"Polar's Trace model rejects {where} = {first_error.get('input')!r} ({first_error.get('msg')})"),
        )
        return False
    verdict.prompt_ids, verdict.response_ids, verdict.logprobs = checked.prompt_ids, checked.response_ids, logprobs
    return True


# --- steps 5 and 6: adapter and count ----------------------------------------------------------------------


def adapt(verdict: PolarVerdict, max_tokens: int | None) -> None:
    """adapter._build_sample for one trace, then the loss-mask ones that remain."""
    prompt, response = verdict.prompt_ids, list(verdict.response_ids)
    if not prompt or not response:
        verdict.stage = "adapter"
        verdict.reason = (
            f"the slime bridge drops the trace: missing tokens (prompt={len(prompt)}, response={len(response)})"
        )
        return
    if not verdict.logprobs:  # _extract_rollout_log_probs
        verdict.stage, verdict.reason = (
            "adapter",
            ("RolloutLogprobError: no rollout logprobs aligned with the response ids, so the group is dropped"),
        )
        return
    if max_tokens is not None and len(prompt) + len(response) > max_tokens:  # _clip_response_to_causal_prefix
        budget = max_tokens - len(prompt)
        if budget <= 0:
            verdict.stage, verdict.reason = (
                "adapter",
                (
                    f"the prompt ({len(prompt)} tokens) leaves no response "
                    f"budget under max_tokens={max_tokens}: trace dropped"
                ),
            )
            return
        response = response[:budget]
    verdict.trainable_tokens = len(response)  # loss_mask = [1] * len(response_ids) for a single completion


def deliver(verdict: PolarVerdict) -> None:
    """Step 7: the result must survive Polar's JSON delivery (json.dumps, allow_nan=False) to count at all."""
    if verdict.trainable_tokens <= 0:
        return
    bad = next((i for i, value in enumerate(verdict.logprobs or []) if not math.isfinite(value)), None)
    if bad is None:
        return
    verdict.trainable_tokens = 0
    verdict.stage = "deliver"
    verdict.reason = (
        f"logprob {bad} is {verdict.logprobs[bad]} (from a numeric string): Polar's gateway sends the session result "
        'as JSON (node.py _push_result: httpx json=, allow_nan=False), which raises "Out of range float values are '
        'not JSON compliant", so the result is lost and nothing is trained'
    )


# --- the whole pipeline ------------------------------------------------------------------------------------


def decide(
    body: bytes, request: dict[str, Any] | None = None, *, tokenizer: Any = None, max_tokens: int | None = None
) -> PolarVerdict:
    """Polar's verdict on one engine answer (raw HTTP body) to `request` (the body Polar sent)."""
    verdict = PolarVerdict()
    parsed, error = parse(body)
    if error is not None:
        verdict.verdict, verdict.stage = UNPARSEABLE, "parse"
        verdict.reason = f"Polar's gateway parses engine answers with orjson, which rejects this body ({error})"
        return verdict
    if not isinstance(parsed, dict):  # response.pop(...) in normalize_response raises on anything else
        verdict.stage = "normalize"
        verdict.reason = f"the body is a JSON {type(parsed).__name__}, not an object: normalize_response raises"
        return verdict
    verdict.response = parsed
    normalized = normalize(parsed)  # step 3 (record) keeps this dict unchanged
    if build_trace(normalized, request or {}, tokenizer, verdict):
        adapt(verdict, max_tokens)
        deliver(verdict)
    if verdict.trainable_tokens > 0:
        verdict.verdict, verdict.stage, verdict.reason = (RETOKENIZED if verdict.retokenized else TRAINABLE), "", ""
        findings(parsed, verdict)
    return verdict
