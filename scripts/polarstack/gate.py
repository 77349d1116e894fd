"""The in-job gate: slime's `--rollout-function-path polarstack.gate.generate_rollout_gated`.

It wraps Polar's rollout function (slime_bridge.rollout.generate_rollout_polar_async, or `polar_gate_delegate`):
- at the first rollout it repeats the smoke against the base URL the job really uses and aborts with the
  diagnosis when the path yields no trainable tokens (for example a router that drops Polar's fields);
- afterwards it counts groups with zero trainable tokens (loss-mask ones), including the groups Polar's
  bridge already dropped for that reason, and aborts after `polar_gate_max_zero_token_groups` consecutive ones;
- a watchdog thread covers what that count cannot see. The pinned Polar drops zero-token groups inside its worker
  and never returns them, and `generate_rollout_polar_async` blocks until `rollout_batch_size` accepted groups
  exist (src/slime_bridge/rollout.py at POLAR_COMMIT, `while len(data) < target`), so behind a field-dropping
  router the call never returns. The watchdog reads the worker's own drop counter while the call runs and stops
  the job when no trainable batch came back within `polar_gate_watchdog_seconds`, or when more groups than
  max(polar_gate_max_zero_token_groups, rollout_batch_size) were dropped for zero trainable tokens in one call.

Counters the pinned Polar exports (AsyncPolarRolloutWorker.snapshot_metrics, once per returned rollout):
`polar/dropped_zero_trainable_groups_since_worker_start` and `polar/dropped_zero_trainable_groups_delta`; the bare
key exists only inside the worker (`_metrics`, incremented by `_inc_metric` in `_submit_and_collect`), which is
what the watchdog reads during a call (under the worker's `_state_lock`, without resetting the deltas).

slime's contract (../shared/reference/slime.md): a synchronous `fn(args, rollout_id, data_source,
evaluation=False)` returning RolloutFnTrainOutput(samples=list[list[Sample]], metrics=...) or a bare list;
settings arrive as attributes of `args` from --custom-config-path.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode

logger = logging.getLogger(__name__)

DEFAULT_DELEGATE = "slime_bridge.rollout.generate_rollout_polar_async"
RAW_COUNTER = "polar/dropped_zero_trainable_groups"  # inside the worker only (AsyncPolarRolloutWorker._metrics)
DELTA_METRIC = f"{RAW_COUNTER}_delta"  # exported per returned rollout (snapshot_metrics)
LIFETIME_METRIC = f"{RAW_COUNTER}_since_worker_start"
DEFAULT_WATCHDOG_SECONDS = 3600.0


class GateAbort(RuntimeError):
    """Raised to stop the training job: the token path yields nothing to train on."""


class _State:
    checked = False
    consecutive_zero = 0
    last_lifetime: float | None = None
    fired: str | None = None


_state = _State()


def reset() -> None:
    _state.checked = False
    _state.consecutive_zero = 0
    _state.last_lifetime = None
    _state.fired = None


def stop_job(message: str, args: Any) -> None:
    """Stop the training job from the watchdog thread: the GATE sentence on stderr and in
    `polar_gate_abort_file` (which `polarstack train` reports), then the process ends with exit code GATE, which
    takes slime's rollout actor, and so the job, down (the blocked Polar call cannot be interrupted otherwise)."""
    abort_file = getattr(args, "polar_gate_abort_file", None)
    if abort_file:
        try:
            Path(abort_file).write_text(message + "\n")
        except OSError:
            logger.exception("polarstack gate: cannot write %s", abort_file)
    logger.critical(message)
    print(message, file=sys.stderr, flush=True)
    os._exit(int(ExitCode.GATE))


def _live_dropped(module_name: str) -> float | None:
    """The worker's zero-trainable drop counter (rollout.py's module-level `_global_async_worker`), read without
    side effects; None when there is no worker."""
    worker = getattr(sys.modules.get(module_name), "_global_async_worker", None)
    metrics, lock = getattr(worker, "_metrics", None), getattr(worker, "_state_lock", None)
    if not isinstance(metrics, dict) or lock is None:
        return None
    with lock:
        return float(metrics.get(RAW_COUNTER, 0.0) or 0.0)


class Watchdog:
    """Armed for the duration of one delegate call; fires `stop_job` once."""

    def __init__(self, args: Any, module_name: str, rollout_id: int) -> None:
        self.args, self.module_name, self.rollout_id = args, module_name, rollout_id
        self.seconds = float(getattr(args, "polar_gate_watchdog_seconds", None) or DEFAULT_WATCHDOG_SECONDS)
        limit = int(getattr(args, "polar_gate_max_zero_token_groups", 3) or 3)
        self.drop_limit = max(limit, int(getattr(args, "rollout_batch_size", 1) or 1))
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="polarstack-gate-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self.started = time.monotonic()
        self.baseline = _live_dropped(self.module_name)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        poll = min(5.0, max(self.seconds / 10, 0.05))
        while not self.done.wait(poll):
            live = _live_dropped(self.module_name)
            dropped = 0.0 if live is None else live - (self.baseline or 0.0)
            waited = time.monotonic() - self.started
            reason = None
            if dropped >= self.drop_limit:
                reason = (f"Polar's bridge dropped {dropped:g} groups for zero trainable tokens during rollout "
                          f"{self.rollout_id} and returned none (limit {self.drop_limit})")
            elif waited >= self.seconds:
                reason = (f"no group with trainable tokens came back within {self.seconds:g} s of rollout "
                          f"{self.rollout_id} ({dropped:g} dropped for zero trainable tokens meanwhile)")
            if reason:
                _state.fired = (f"polarstack gate: stopping the job, {reason}; the inference path yields nothing to "
                                "train on. Run `make smoke` against this profile for the diagnosis.")
                stop_job(_state.fired, self.args)
                return


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


def _dropped(metrics: dict[str, Any]) -> int:
    """Zero-trainable groups Polar dropped during this rollout: the exported `_delta`, else the difference of
    `_since_worker_start` between two rollouts."""
    if DELTA_METRIC in metrics:
        return int(float(metrics[DELTA_METRIC] or 0))
    if LIFETIME_METRIC in metrics:
        lifetime = float(metrics[LIFETIME_METRIC] or 0)
        previous, _state.last_lifetime = _state.last_lifetime, lifetime
        return int(max(0.0, lifetime - (previous or 0.0)))
    return 0


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
    from polarstack.retokenize import configured_name

    # The job's own Polar config decides whether Polar's builder re-tokenizes (polarstack.retokenize).
    tokenizer_name = configured_name({"polar_task_template": getattr(args, "polar_task_template", None)})
    report = run_smoke(base_url, route=getattr(args, "polar_gate_route", "base") or "base",
                       model=getattr(args, "polar_served_model_name", None), timeout=30.0,
                       tokenizer_name=tokenizer_name,
                       allow_retokenized=bool(getattr(args, "polar_gate_allow_retokenized", False)))
    if not report.ok:
        raise GateAbort(f"polarstack gate: refusing to train, the inference path fails the smoke: {report.message}")
    logger.info("polarstack gate: %s", report.message)


def generate_rollout_gated(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    if not _state.checked and not evaluation:
        first_rollout_check(args)
        _state.checked = True
    path = getattr(args, "polar_gate_delegate", None) or DEFAULT_DELEGATE
    delegate = _load(path)
    if evaluation:
        return delegate(args, rollout_id, data_source, evaluation=evaluation)
    try:
        with Watchdog(args, path.rpartition(".")[0], rollout_id):
            output = delegate(args, rollout_id, data_source, evaluation=evaluation)
    except Exception:
        if _state.fired:
            raise GateAbort(_state.fired) from None
        raise
    if _state.fired:
        raise GateAbort(_state.fired)
    limit = int(getattr(args, "polar_gate_max_zero_token_groups", 3) or 3)
    groups, metrics = _groups_and_metrics(output)
    dropped = _dropped(metrics)
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
