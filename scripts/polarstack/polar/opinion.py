"""A second opinion from the installed Polar (inside the trainer image, where `polar` is importable): Polar's own
functions run on the smoke's raw answers, and the smoke fails when their count disagrees with polarstack.polar.model's.

Called, by name, as at POLAR_COMMIT: `orjson.loads` (proxy.py InferenceClient._completion),
`polar.gateway.engine.get_engine("sglang").normalize_response`, `polar.trajectory.models.CompletionRecord`,
`polar.trajectory.builder.record_utils.build_trace_from_completion(completion, tokenizer=...)`. The slime bridge's
adapter needs slime's Sample and a whole SessionResult, so its drop rules (empty prompt/response ids, missing
logprobs: slime_bridge/adapter.py `_build_sample`, `_extract_rollout_log_probs`) are applied to Polar's real Trace.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

MODULES = ("polar.gateway.engine", "polar.trajectory.models", "polar.trajectory.builder.record_utils")


def available() -> bool:
    try:
        return all(importlib.util.find_spec(name) is not None for name in MODULES)
    except (ImportError, ValueError):
        return False


def trainable_tokens(
    body: bytes, request: dict[str, Any], tokenizer: Any = None, max_tokens: int | None = None
) -> tuple[int, str]:
    """(tokens, where it ended) as the installed Polar computes them for one answer."""
    import orjson
    from polar.gateway.engine import get_engine
    from polar.trajectory.builder.record_utils import build_trace_from_completion
    from polar.trajectory.models import CompletionRecord

    try:
        response = get_engine("sglang").normalize_response(orjson.loads(body))
    except Exception as exc:  # Polar's request fails: orjson.JSONDecodeError, or normalize_response on a non-object
        return 0, f"parse/normalize: {type(exc).__name__}"
    try:
        record = CompletionRecord(completion_id="polarstack-smoke", request=request, response=response)
        accepts_tokenizer = "tokenizer" in inspect.signature(build_trace_from_completion).parameters
        trace = (
            build_trace_from_completion(record, tokenizer=tokenizer)
            if accepts_tokenizer
            else build_trace_from_completion(record)
        )
    except Exception as exc:  # a failed build leaves the session without a trace
        return 0, f"trace: {type(exc).__name__}"
    prompt, response_ids = list(trace.prompt_ids), list(trace.response_ids)
    if not prompt or not response_ids:
        return 0, "adapter: missing tokens"
    if not trace.response_logprobs:
        return 0, "adapter: RolloutLogprobError"
    if max_tokens is not None and len(prompt) + len(response_ids) > max_tokens:
        budget = max_tokens - len(prompt)
        if budget <= 0:
            return 0, "adapter: prompt over max_tokens"
        return sum(1 for m in list(trace.loss_mask)[:budget] if m), "kept (clipped)"
    return sum(1 for m in trace.loss_mask if m), "kept"
