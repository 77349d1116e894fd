"""The in-job gate: slime's `--rollout-function-path polarstack.train.gate.generate_rollout_gated`.

It wraps Polar's rollout function (slime_bridge.rollout.generate_rollout_polar_async, or `polar_gate_delegate`):
- at the first rollout it repeats the smoke against the base URL the job really uses and aborts with the
  diagnosis when the path yields no trainable tokens (for example a router that drops Polar's fields);
- afterwards it counts groups with zero trainable tokens (loss-mask ones), including the groups Polar's
  bridge already dropped for that reason, and aborts after `polar_gate_max_zero_token_groups` consecutive ones;
- after each rollout it checks the rewards: when every sample of the last `polar_gate_zero_reward_rollouts`
  rollouts has reward 0 and at least half of them carry a verifier refusal (the verifier could not verify, for
  example its sandbox cannot be set up), it aborts naming the refusal; all-zero without a refusal is only a loud
  warning (a hard task can start at 0);
- a watchdog thread covers what those counts cannot see. The pinned Polar drops zero-token groups inside its
  worker and never returns them, and `generate_rollout_polar_async` blocks until `rollout_batch_size` accepted
  groups exist (src/slime_bridge/rollout.py at POLAR_COMMIT, `while len(data) < target`), so behind a
  field-dropping router the call never returns. The watchdog reads the worker's own counters while the call
  runs and measures progress, not the call's length: it stops the job (a) when no group with trainable tokens
  arrived and more than max(polar_gate_max_zero_token_groups, rollout_batch_size) groups were dropped for zero
  trainable tokens during the call, or (b) when the worker submitted, completed and dropped no group at all for
  `polar_gate_watchdog_seconds`. A slow rollout that keeps finishing groups is never stopped.

Every stop writes its one sentence to `polar_gate_abort_file` first, so `polarstack train` reports it with the
GATE exit code whichever way the job ended (a GateAbort raised into slime, or the watchdog's process exit).

Counters read inside the pinned worker (AsyncPolarRolloutWorker in rollout.py at POLAR_COMMIT; the raw keys live
in `_metrics` under `_state_lock`, and `snapshot_metrics` exports them only with the `_since_worker_start` /
`_delta` suffixes once per returned rollout): `_group_counter` (groups submitted, `_async_loop`),
`polar/completed_groups` (a group with trainable tokens handed to the output queue, `_emit_completed`),
`polar/dropped_groups` (any drop: `_submit_and_collect`, `drain_completed`, `mark_dynamic_filter_drop`) and
`polar/dropped_zero_trainable_groups` (`_submit_and_collect`). The worker has no per-sample counter: a task's
sessions finish on the rollout server and the worker sees the group only when the task ends.

slime's contract (../shared/reference/slime.md): a synchronous `fn(args, rollout_id, data_source,
evaluation=False)` returning RolloutFnTrainOutput(samples=list[list[Sample]], metrics=...) or a bare list;
settings arrive as attributes of `args` from --custom-config-path.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from polarstack.checks import smoke, tool_exchange
from polarstack.checks.retokenize import configured_name
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode
from polarstack.reward.verifier.verdict import is_refusal
from polarstack.stack import verifier_knobs
from polarstack.train import learning_signal

logger = logging.getLogger(__name__)

DEFAULT_DELEGATE = "slime_bridge.rollout.generate_rollout_polar_async"
RAW_COUNTER = "polar/dropped_zero_trainable_groups"  # inside the worker only (AsyncPolarRolloutWorker._metrics)
DELTA_METRIC = f"{RAW_COUNTER}_delta"  # exported per returned rollout (snapshot_metrics)
LIFETIME_METRIC = f"{RAW_COUNTER}_since_worker_start"
COMPLETED_COUNTER = "polar/completed_groups"  # _emit_completed: a trainable group reached the output queue
DROPPED_COUNTER = "polar/dropped_groups"  # every drop, whatever the reason
DEFAULT_WATCHDOG_SECONDS = 3600.0
DEFAULT_ZERO_REWARD_ROLLOUTS = 3
# This project's verifier when it refuses to verify (scripts/polarstack/reward/verifier/): slime's reward_func sets
# metadata["verifier_error"]; the evaluator command line prints `FAILED <name> (not verified)` and its reason on
# stderr, and exits 8. Which output line says so is verifier/verdict.py's rule (`is_refusal`), the one it writes by.
REFUSAL_EXIT_CODE = 8
# Where a refusal graded by Polar's test_on_output evaluator lands (configs/upstream/polar-grading.json, "evaluation"
# and "carried"; jxliu1216/ProRL-Agent-Server c04b8146832afcba97e9e68e86cde03a09c472f2, the fork that stores the
# evaluator): test_on_output.py `TestOnOutputEvaluator._grade` builds report = {..., "exit_code": result.return_code
# (the test command's), "parsed_tests": _parse_expected_output(stdout + stderr), ...}; _patch_utils.py
# `BasePatchEvaluator.evaluate` stores it as metadata["report"]; Polar's gateway (NVIDIA-NeMo/ProRL-Agent-Server
# src/polar/gateway/node.py at POLAR_COMMIT, `GatewayNodeManager._merge_eval_result`) spreads that metadata into
# trajectory.metadata["evaluation"], which the slime bridge copies to Sample.metadata["polar"]["trajectory_metadata"]
# (src/slime_bridge/adapter.py `_build_sample`, read at 063c9482). `make verify-offline` checks these names against the
# record (polarstack.offline.verifier_output).
SAMPLE_PATH = ("polar", "trajectory_metadata", "evaluation")
REPORT_KEY = "report"
REPORT_EXIT_CODE = "exit_code"
REPORT_PARSED_TESTS = "parsed_tests"
REPORT_READS = (REPORT_EXIT_CODE, REPORT_PARSED_TESTS)  # every key the gate reads inside the report
# The harbor evaluator's exit-code key (src/polar/trajectory/evaluator/harbor.py `HarborEvaluator.evaluate`, read at
# 063c9482; not stored at the pin), which Polar's bridge reads at POLAR_COMMIT (src/slime_bridge/rollout.py
# `_has_trusted_eval_failure`: exit 0 with verifier_reward_accepted is a trusted eval outcome). test_on_output never
# writes it; read for a task whose evaluator is harbor running this verifier as its test command.
HARBOR_EXIT_CODE = "verifier_exit_code"


class GateAbort(RuntimeError):
    """Raised to stop the training job: the token path yields nothing to train on."""


class _State:
    checked = False
    consecutive_zero = 0
    last_lifetime: float | None = None
    fired: str | None = None
    zero_reward_rollouts: list[tuple[int, int, str | None]] = []  # (samples, refusals, first reason) per rollout


gate_state = _State()
_zero_advantage = learning_signal.ZeroAdvantageWatch()


def reset() -> None:
    _zero_advantage.reset()
    gate_state.checked = False
    gate_state.consecutive_zero = 0
    gate_state.last_lifetime = None
    gate_state.fired = None
    gate_state.zero_reward_rollouts = []


def write_abort(message: str, args: Any) -> None:
    """The stop's sentence in `polar_gate_abort_file`, which `polarstack train` reports with exit code GATE."""
    abort_file = getattr(args, "polar_gate_abort_file", None)
    if abort_file:
        try:
            Path(abort_file).write_text(message + "\n")
        except OSError:
            logger.exception("polarstack gate: cannot write %s", abort_file)


def polar_logs(args: Any) -> str:
    """Polar's server logs of this run, by the host's path: launch.sh writes them beside the abort file in the run's
    directory (.run/train/<run>/ on the host, mounted in the trainer); `make logs SERVICE=trainer` shows only the Ray
    head."""
    abort_file = getattr(args, "polar_gate_abort_file", None)
    run = f".run/train/{Path(abort_file).parent.name}" if abort_file else "the run's .run/train/<run>"
    return f"{run}/polar-rollout.log and polar-gateway.log"


def _abort(message: str, args: Any) -> GateAbort:
    """Every stop raised into slime goes through here: the sentence is on disk before the job ends."""
    write_abort(message, args)
    logger.critical(message)
    return GateAbort(message)


def stop_job(message: str, args: Any) -> None:
    """Stop the training job from the watchdog thread: the GATE sentence on stderr and in
    `polar_gate_abort_file`, then the process ends with exit code GATE, which takes slime's rollout actor, and
    so the job, down (the blocked Polar call cannot be interrupted otherwise)."""
    write_abort(message, args)
    logger.critical(message)
    print(message, file=sys.stderr, flush=True)
    os._exit(int(ExitCode.GATE))


def _live_counters(module_name: str) -> tuple[int, dict[str, float]] | None:
    """The worker's progress counters (rollout.py's module-level `_global_async_worker`), read under its
    `_state_lock` without side effects (snapshot_metrics would reset the deltas); None when there is no worker.
    The first item identifies the worker: Polar replaces a dead one, whose counters start again at 0."""
    worker = getattr(sys.modules.get(module_name), "_global_async_worker", None)
    metrics, lock = getattr(worker, "_metrics", None), getattr(worker, "_state_lock", None)
    if not isinstance(metrics, dict) or lock is None:
        return None
    with lock:
        values = {key: float(metrics.get(key, 0.0) or 0.0) for key in (COMPLETED_COUNTER, DROPPED_COUNTER, RAW_COUNTER)}
        values["submitted"] = float(getattr(worker, "_group_counter", 0) or 0)
    return id(worker), values


def live_dropped(module_name: str) -> float | None:
    """The worker's zero-trainable drop counter alone (what `make verify-offline` probes); None without a worker."""
    live = _live_counters(module_name)
    return None if live is None else live[1][RAW_COUNTER]


class Watchdog:
    """Armed for the duration of one delegate call; fires `stop_job` once, on (a) zero-token drops with no
    trainable group, or (b) no progress of the worker's counters for `polar_gate_watchdog_seconds`."""

    def __init__(self, args: Any, module_name: str, rollout_id: int) -> None:
        self.args, self.module_name, self.rollout_id = args, module_name, rollout_id
        self.seconds = float(getattr(args, "polar_gate_watchdog_seconds", None) or DEFAULT_WATCHDOG_SECONDS)
        limit = int(getattr(args, "polar_gate_max_zero_token_groups", 3) or 3)
        self.drop_limit = max(limit, int(getattr(args, "rollout_batch_size", 1) or 1))
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="polarstack-gate-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self.started = time.monotonic()
        self.baseline = _live_counters(self.module_name)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _since_start(self, live: tuple[int, dict[str, float]] | None) -> dict[str, float]:
        if live is None:
            return {}
        if self.baseline is None or self.baseline[0] != live[0]:  # no worker at the start, or a new one
            self.baseline = (live[0], {key: 0.0 for key in live[1]})
        return {key: value - self.baseline[1].get(key, 0.0) for key, value in live[1].items()}

    def _run(self) -> None:
        poll = min(5.0, max(self.seconds / 10, 0.05))
        progress_at, last_seen = self.started, None
        while not self.done.wait(poll):
            counts = self._since_start(_live_counters(self.module_name))
            now = time.monotonic()
            seen = (counts.get("submitted", 0.0), counts.get(COMPLETED_COUNTER, 0.0), counts.get(DROPPED_COUNTER, 0.0))
            if seen != last_seen and any(seen):  # a group was submitted, completed or dropped since the last poll
                progress_at, last_seen = now, seen
            trainable, dropped = counts.get(COMPLETED_COUNTER, 0.0), counts.get(RAW_COUNTER, 0.0)
            reason = None
            if not trainable and dropped >= self.drop_limit:
                reason = (
                    f"Polar's bridge dropped {dropped:g} groups for zero trainable tokens during rollout "
                    f"{self.rollout_id} and no group with trainable tokens arrived (limit {self.drop_limit})"
                )
            elif now - progress_at >= self.seconds:
                reason = (
                    f"rollout {self.rollout_id} made no progress for {self.seconds:g} s: Polar's worker "
                    f"submitted, completed and dropped no group in that time ({trainable:g} groups with "
                    f"trainable tokens and {dropped:g} dropped for zero trainable tokens during this rollout)"
                )
            if reason:
                gate_state.fired = (
                    f"polarstack gate: stopping the job, {reason}. Run `make smoke` against this profile "
                    f"and see {polar_logs(self.args)} for the diagnosis."
                )
                stop_job(gate_state.fired, self.args)
                return


def _load(path: str, args: Any):
    module, _, name = path.rpartition(".")
    if not module:
        raise _abort(
            f"polarstack gate: polar_gate_delegate={path!r} must be module.function; set gate.delegate "
            "in configs/train/defaults.yaml.",
            args,
        )
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
        previous, gate_state.last_lifetime = gate_state.last_lifetime, lifetime
        return int(max(0.0, lifetime - (previous or 0.0)))
    return 0


def trainable_tokens(group: list[Any]) -> int:
    total = 0
    for sample in group:
        if getattr(sample, "remove_sample", False):
            continue
        total += sum(1 for m in (getattr(sample, "loss_mask", None) or []) if m)
    return total


def sample_reward(sample: Any, key: str = "score") -> float:
    """The scalar reward as Polar's slime_bridge/reward.py `_extract_reward` reads it: a dict's `key`, else its
    "score", else its first number; a bare number; anything else (or non-finite) is 0."""
    reward = getattr(sample, "reward", None)
    if isinstance(reward, dict):
        numbers = [v for v in reward.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        reward = reward.get(key, reward.get("score", numbers[0] if numbers else 0.0))
    elif not isinstance(reward, (int, float)):
        return 0.0
    if isinstance(reward, bool):
        return 0.0
    try:
        value = float(reward)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return value if math.isfinite(value) else 0.0


def _evaluation(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The evaluator's metadata as Polar's gateway merged it and its bridge copied it to the sample."""
    value: Any = metadata
    for key in SAMPLE_PATH:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else None


def _refusal_code(code: Any) -> bool:
    return not isinstance(code, bool) and code == REFUSAL_EXIT_CODE  # True == 1 is no exit code


def refusal_reason(sample: Any) -> str | None:
    """Why the verifier did not verify this sample, if it says so; None otherwise.

    - slime's reward_func path: this project's reward_func sets metadata["verifier_error"];
    - Polar's test_on_output evaluator (the one this stack's tasks name, reward/tasks.py): the report under
      evaluation["report"] (see REPORT_KEY above for the upstream functions): a `parsed_tests` entry whose status
      line, rebuilt as `<status> <id>` (the parser splits a line at its first whitespace and keeps the id whole
      when it holds neither ` - ` nor `::`, as the verifier's name does), is this verifier's refusal line
      (`verdict.is_refusal`), or `exit_code` 8, the verifier's exit when it refuses;
    - the harbor evaluator: evaluation["verifier_exit_code"] 8 (HARBOR_EXIT_CODE above).

    Nothing else in the evaluation is read. No evaluator at those revisions puts the test command's output text in
    the metadata (test_on_output writes it to `expected_output.test_output.log`, harbor to `verifier.stdout.log`,
    and only their paths are kept, in session directories removed when the session ends), so a scan of the
    mapping's strings finds no verifier line; the strings it does hold include the candidate's own patch
    (`apply_patch_patch_head`, the first 4000 characters of the agent's diff when it does not apply, evaluate in
    _patch_utils.py) and git's output on it, text a candidate writes, where such a scan would read a refusal it
    forged. The parsed map holds only what the parser took from the output, which the verifier keeps to its own
    single status line (docs/tasks.md)."""
    metadata = getattr(sample, "metadata", None)
    if not isinstance(metadata, dict):
        return None
    if metadata.get("verifier_error"):
        return str(metadata["verifier_error"])
    evaluation = _evaluation(metadata)
    if evaluation is None:
        return None
    report = evaluation.get(REPORT_KEY)
    if isinstance(report, dict):
        parsed = report.get(REPORT_PARSED_TESTS)
        for node, status in parsed.items() if isinstance(parsed, dict) else ():
            line = f"{status} {node}"
            if isinstance(node, str) and isinstance(status, str) and is_refusal(line):
                return line[:300]
        if _refusal_code(report.get(REPORT_EXIT_CODE)):
            return f"the verifier exited {REFUSAL_EXIT_CODE} (not verified)"
    if _refusal_code(evaluation.get(HARBOR_EXIT_CODE)):
        return f"the verifier exited {REFUSAL_EXIT_CODE} (not verified)"
    return None


def check_rewards(args: Any, groups: list[list[Any]], rollout_id: int) -> None:
    """Stop when the last K rollouts rewarded nothing because the verifier refused; warn when they rewarded
    nothing without saying why."""
    k = int(getattr(args, "polar_gate_zero_reward_rollouts", None) or DEFAULT_ZERO_REWARD_ROLLOUTS)
    key = str(getattr(args, "polar_reward_key", None) or getattr(args, "reward_key", None) or "score")
    samples = [sample for group in groups for sample in group]
    if not samples:
        return
    if any(sample_reward(sample, key) != 0.0 for sample in samples):
        gate_state.zero_reward_rollouts = []
        return
    reasons = [reason for reason in map(refusal_reason, samples) if reason]
    gate_state.zero_reward_rollouts = (
        gate_state.zero_reward_rollouts + [(len(samples), len(reasons), reasons[0] if reasons else None)]
    )[-k:]
    if len(gate_state.zero_reward_rollouts) < k:
        return
    total = sum(n for n, _, _ in gate_state.zero_reward_rollouts)
    refused = sum(r for _, r, _ in gate_state.zero_reward_rollouts)
    first = next((reason for _, _, reason in gate_state.zero_reward_rollouts if reason), None)
    if refused * 2 >= total:
        raise _abort(
            f"polarstack gate: stopping the job, all {total} samples of the last {k} rollouts (up to "
            f"rollout {rollout_id}) have reward 0 and {refused} of them were not verified: {first}. Fix "
            "the verifier's sandbox (`polarstack verify` names the failing step) instead of training on "
            "rewards it never computed.",
            args,
        )
    message = (
        f"polarstack gate: WARNING all {total} samples of the last {k} rollouts (up to rollout "
        f"{rollout_id}) have reward 0 ({refused} carry a verifier refusal); the task may be too hard for the "
        "model, or the reward path is broken: check polar/reward_mean and the evaluator's output."
    )
    logger.warning(message)
    print(message, file=sys.stderr, flush=True)


def agent_env_of(args: Any) -> dict[str, str] | None:
    """The task template's agent.env; None when the job has no task template (the smoke then uses the defaults)."""
    template = getattr(args, "polar_task_template", None)
    return ((template.get("agent") or {}).get("env") or {}) if isinstance(template, dict) else None


def first_rollout_check(args: Any) -> None:
    base_url = getattr(args, "polar_gate_base_url", None)
    if not base_url:
        raise _abort(
            "polarstack gate: polar_gate_base_url is not set in the custom config; render the launch "
            "with `polarstack train` so the gate knows which path to check.",
            args,
        )

    # The job's own Polar config decides whether Polar's builder re-tokenizes (polarstack.checks.retokenize).
    tokenizer_name = configured_name({"polar_task_template": getattr(args, "polar_task_template", None)})
    target = SmokeTarget(
        base_url,
        route=getattr(args, "polar_gate_route", "base") or "base",
        agent_env=agent_env_of(args),  # the agent's per-request max_tokens as the job renders it (issue 18 point 2)
    )
    knobs = tool_exchange.knobs_from(os.environ)  # in-job: the smoke's knobs the job's runtime env carries (plan.py)
    options = SmokeOptions(
        model=getattr(args, "polar_served_model_name", None),
        timeout=tool_exchange.smoke_deadline(knob=knobs.timeout),  # the host gate's rule
        tokenizer_name=tokenizer_name,
        allow_retokenized=bool(getattr(args, "polar_gate_allow_retokenized", False)),
        knobs=knobs,
    )
    report = smoke.run_smoke(target, options)
    if not report.ok and report.code == ExitCode.UNREACHABLE:
        # No answer within the deadline, or the connection lost: not a defect of the path, so not a gate stop (no
        # abort file): the job fails as a crash, and `make train`'s supervisor restarts it by its rules.
        raise RuntimeError(
            f"polarstack gate: the first-rollout smoke got no answer ({report.message}); not a gate stop, the "
            f"supervisor may restart the job (raise {tool_exchange.TIMEOUT_ENV} if the engines are slow)"
        )
    if not report.ok:
        raise _abort(f"polarstack gate: refusing to train, the inference path fails the smoke: {report.message}", args)
    logger.info("polarstack gate: %s", report.message)


def verifier_opt_out(args: Any) -> str | None:
    """The sentence naming an active POLARSTACK_VERIFIER_ISOLATION=none: in the task template's runtime.env (what
    Polar's test_command sees) or in the job's environment (the Ray job's env_vars); None when isolation is on."""
    template = getattr(args, "polar_task_template", None)
    runtime = ((template.get("runtime") or {}).get("env") or {}) if isinstance(template, dict) else {}
    env = {
        verifier_knobs.ISOLATION: str(
            runtime.get(verifier_knobs.ISOLATION) or os.environ.get(verifier_knobs.ISOLATION) or ""
        )
    }
    return verifier_knobs.opt_out_sentence() if verifier_knobs.opted_out(env) else None


def generate_rollout_gated(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    if not gate_state.checked and not evaluation:
        first_rollout_check(args)
        gate_state.checked = True
        opted_out = verifier_opt_out(args)
        if opted_out is not None:  # named once, at the first rollout, in the job's log
            message = f"polarstack gate: WARNING {opted_out}"
            logger.warning(message)
            print(message, file=sys.stderr, flush=True)
    path = getattr(args, "polar_gate_delegate", None) or DEFAULT_DELEGATE
    delegate = _load(path, args)
    if evaluation:
        return delegate(args, rollout_id, data_source, evaluation=evaluation)
    started = time.monotonic()
    try:
        with Watchdog(args, path.rpartition(".")[0], rollout_id):
            output = delegate(args, rollout_id, data_source, evaluation=evaluation)
    except Exception:
        if gate_state.fired:
            raise _abort(gate_state.fired, args) from None
        raise
    if gate_state.fired:
        raise _abort(gate_state.fired, args)
    limit = int(getattr(args, "polar_gate_max_zero_token_groups", 3) or 3)
    groups, metrics = _groups_and_metrics(output)
    dropped = _dropped(metrics)
    trained = [trainable_tokens(group) for group in groups]
    if not any(trained):
        gate_state.consecutive_zero += dropped + len(groups)
    else:
        tail = 0
        for tokens in reversed(trained):
            if tokens:
                break
            tail += 1
        gate_state.consecutive_zero = tail
    if gate_state.consecutive_zero >= limit:
        raise _abort(
            f"polarstack gate: {gate_state.consecutive_zero} consecutive rollout groups had zero trainable "
            f"tokens (limit {limit}, rollout {rollout_id}, {dropped} dropped by Polar's bridge); stopping "
            "instead of training on nothing. Run `make smoke` against this profile for the diagnosis.",
            args,
        )
    check_rewards(args, groups, rollout_id)
    watch_learning_signal(args, rollout_id, output, groups, dropped, time.monotonic() - started)
    return output


def watch_learning_signal(
    args: Any, rollout_id: int, output: Any, groups: list[list[Any]], dropped: int, seconds: float
) -> None:
    """The rollout's learning signal (polarstack.train.learning_signal): its summary line, its tracker metrics (added to
    the metrics slime logs), and the zero-advantage watch, whose stop is a GATE stop like every other."""
    key = str(getattr(args, "polar_reward_key", None) or getattr(args, "reward_key", None) or "score")
    summaries = [learning_signal.group_summary(g, lambda s: sample_reward(s, key), trainable_tokens) for g in groups]
    summary = learning_signal.rollout_summary(rollout_id, summaries, dropped, seconds, polar_drops(metrics_of(output)))
    learning_signal.write_summary(args, summary)
    watch_context_limit(args, rollout_id, summaries)
    if isinstance(getattr(output, "metrics", None), dict):
        output.metrics.update(learning_signal.metrics(summary))
    verdict = _zero_advantage.observe(args, rollout_id, summaries)
    if verdict and verdict[0] == "stop":
        raise _abort(verdict[1], args)
    if verdict:
        logger.warning(verdict[1])
        print(verdict[1], file=sys.stderr, flush=True)


# Polar's worker counts every group it drops by reason (rollout.py at POLAR_COMMIT, `_submit_and_collect`: zero
# trainable tokens, PolarLowCompleteAcceptFractionError "low complete accept fraction", RolloutLogprobError, any other
# task failure; `mark_dynamic_filter_drop`) and exports each as `<key>_delta` per returned rollout (snapshot_metrics).
POLAR_DROP_COUNTERS = {
    "zero_trainable": "polar/dropped_zero_trainable_groups",
    "low_complete_fraction": "polar/dropped_low_complete_fraction_groups",
    "logprob_error": "polar/dropped_logprob_error_groups",
    "failed": "polar/dropped_failed_groups",
    "dynamic_filter": "polar/dropped_dynamic_filter_groups",
    "sessions": "polar/dropped_sessions",
}
DEFAULT_CONTEXT_LIMIT_WARN_SHARE = 0.1


def metrics_of(output: Any) -> dict[str, Any]:
    metrics = getattr(output, "metrics", None)
    return metrics if isinstance(metrics, dict) else {}


def polar_drops(metrics: dict[str, Any]) -> dict[str, float]:
    """This rollout's drops by reason from Polar's exported `_delta` counters (absent counters are 0)."""
    out = {}
    for name, key in POLAR_DROP_COUNTERS.items():
        try:
            out[name] = float(metrics.get(f"{key}_delta") or 0.0)
        except (TypeError, ValueError):
            out[name] = 0.0
    return out


def watch_context_limit(args: Any, rollout_id: int, summaries: list[dict[str, Any]]) -> str | None:
    """The share of this rollout's sessions that ended at the engine's context (sglang refused a turn: issue 26
    point 4): a loud warning above `polar_gate_context_limit_warn_share`, since their last turns are lost and the
    per-session turn cap (agent.settings.max_turns) did not keep them inside. Returns the warning, if any."""
    share = learning_signal.session_shares(summaries)["at_context_limit"]
    limit = float(getattr(args, "polar_gate_context_limit_warn_share", None) or DEFAULT_CONTEXT_LIMIT_WARN_SHARE)
    if share <= limit:
        return None
    ended = sum(int(g.get("sessions_at_context_limit", 0)) for g in summaries)
    message = (
        f"polarstack gate: WARNING {ended} sessions of rollout {rollout_id} ({share:.0%}, above {limit:.0%}) ended "
        "at the engine's context (sglang refused a turn: input + max_tokens over the context), so their last turns "
        'are lost; lower context.agent_max_output_tokens or the turn cap (docs/gpu-node.md, "Sequence length").'
    )
    logger.warning(message)
    print(message, file=sys.stderr, flush=True)
    return message
