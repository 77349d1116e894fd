"""The in-job gate: slime's `--rollout-function-path polarstack.gate.generate_rollout_gated`.

It wraps Polar's rollout function (slime_bridge.rollout.generate_rollout_polar_async, or `polar_gate_delegate`):
- at the first rollout it repeats the smoke against the base URL the job really uses and aborts with the
  diagnosis when the path yields no trainable tokens (for example a router that drops Polar's fields);
- afterwards it counts groups with zero trainable tokens (loss-mask ones), including the groups Polar's
  bridge already dropped for that reason (metric `polar/dropped_zero_trainable_groups`), and aborts after
  `polar_gate_max_zero_token_groups` consecutive ones instead of training on nothing.

slime's contract (../shared/reference/slime.md): a synchronous `fn(args, rollout_id, data_source,
evaluation=False)` returning RolloutFnTrainOutput(samples=list[list[Sample]], metrics=...) or a bare list;
settings arrive as attributes of `args` from --custom-config-path.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_DELEGATE = "slime_bridge.rollout.generate_rollout_polar_async"
DROPPED_METRIC = "polar/dropped_zero_trainable_groups"


class GateAbort(RuntimeError):
    """Raised to stop the training job: the token path yields nothing to train on."""


class _State:
    checked = False
    consecutive_zero = 0


_state = _State()


def reset() -> None:
    _state.checked = False
    _state.consecutive_zero = 0


def _load(path: str):
    module, _, name = path.rpartition(".")
    if not module:
        raise GateAbort(f"polar_gate_delegate={path!r} must be module.function")
    return getattr(importlib.import_module(module), name)


def _groups_and_metrics(output: Any) -> tuple[list[list[Any]], dict[str, Any]]:
    samples = getattr(output, "samples", output)
    metrics = getattr(output, "metrics", None) or {}
    groups = [g if isinstance(g, list) else [g] for g in (samples or [])]
    return groups, metrics if isinstance(metrics, dict) else {}


def trainable_tokens(group: list[Any]) -> int:
    total = 0
    for sample in group:
        if getattr(sample, "remove_sample", False):
            continue
        total += sum(1 for m in (getattr(sample, "loss_mask", None) or []) if m)
    return total


def first_rollout_check(args: Any) -> None:
    from polarstack.smoke import run_smoke

    base_url = getattr(args, "polar_gate_base_url", None)
    if not base_url:
        raise GateAbort("polar_gate_base_url is not set in the custom config; render the launch with "
                        "`polarstack train` so the gate knows which path to check.")
    report = run_smoke(base_url, route=getattr(args, "polar_gate_route", "base") or "base",
                       model=getattr(args, "polar_served_model_name", None), timeout=30.0)
    if not report.ok:
        raise GateAbort(f"polarstack gate: refusing to train, the inference path fails the smoke: {report.message}")
    logger.info("polarstack gate: %s", report.message)


def generate_rollout_gated(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    if not _state.checked and not evaluation:
        first_rollout_check(args)
        _state.checked = True
    delegate = _load(getattr(args, "polar_gate_delegate", None) or DEFAULT_DELEGATE)
    output = delegate(args, rollout_id, data_source, evaluation=evaluation)
    if evaluation:
        return output
    limit = int(getattr(args, "polar_gate_max_zero_token_groups", 3) or 3)
    groups, metrics = _groups_and_metrics(output)
    dropped = int(metrics.get(DROPPED_METRIC, 0) or 0)
    trained = [trainable_tokens(group) for group in groups]
    if not any(trained):
        _state.consecutive_zero += dropped + len(groups)
    else:
        tail = 0
        for tokens in reversed(trained):
            if tokens:
                break
            tail += 1
        _state.consecutive_zero = tail
    if _state.consecutive_zero >= limit:
        raise GateAbort(f"polarstack gate: {_state.consecutive_zero} consecutive rollout groups had zero trainable "
                        f"tokens (limit {limit}, rollout {rollout_id}, {dropped} dropped by Polar's bridge); stopping "
                        "instead of training on nothing. Run `make smoke` against this profile for the diagnosis.")
    return output
