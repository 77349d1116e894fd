"""The rehearsal's report: for each silent-failure class, the measured figure and a verdict (pass, warn, fail).

The evidence is what the two jobs of `make preflight` leave behind, each read where its writer puts it (the keys
are recorded in configs/upstream/rehearsal-keys.json; `make verify-offline` finds each one in the pinned sources):
- rollouts.jsonl: one line per rollout from the in-job gate (polarstack.train.learning_signal), built from the samples
  Polar's adapter hands to slime (src/slime_bridge/adapter.py `_build_sample` / `_build_dummy_sample`);
- slime's log lines in the jobs' output: `step N: {...}` per training step (slime/backends/megatron_utils/model.py
  l.909 at SLIME_COMMIT, keys train/loss, train/grad_norm l.876-880) and `perf N: {...}` per rollout
  (slime/ray/rollout.py l.1306, key perf/rollout_time);
- each engine's `GET /model_info` "weight_version" before job 1 and after each job (sglang at SGLANG_VERSION
  srt/entrypoints/http_server.py l.665-679);
- the checkpoint tracker latest_checkpointed_iteration.txt after each job: slime saves rollout r as iteration r
  (train_async.py l.60 `save_model(rollout_id)`, slime/backends/megatron_utils/model.py l.954 `save_checkpoint(
  iteration, ...)`) and a resume starts at the loaded iteration + 1 (slime/backends/megatron_utils/actor.py l.107);
- the wall time of each phase, measured by `make preflight`.
- the sandbox probe's rewards (`reward_path`: the verifier through the agent sandbox gave the canonical HumanEval/0
  reward 1 and a wrong answer 0) and job 2's attempts under the supervisor (`supervisor`), from `make preflight`.
What kills learning without a crash (issue 26 point 2) has a class of its own: sessions Polar's adapter masks
(failed, timed out) and groups its worker drops (`PolarLowCompleteAcceptFractionError`, polar/dropped_* counters);
sessions ended at the engine's context; no group with mixed rewards in any step (a model shortfall only when the
reward path is shown to give reward 1), and a gradient that does not follow the advantages.
A warning is a model shortfall (the small model never called a tool or never solved a task), not a broken stack;
only failures make the report exit non-zero, naming the first failing class and what to change.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError

STEP_LINE = re.compile(r"(?<![\w-])step (\d+): (\{.*\})\s*$")  # model.py l.909, the actor's role_tag is ""
PERF_LINE = re.compile(r"(?<![\w-])perf (\d+): (\{.*\})\s*$")  # rollout.py l.1306
LOSS_KEY, GRAD_KEY, ROLLOUT_TIME_KEY = "train/loss", "train/grad_norm", "perf/rollout_time"
# issue 32 point 7: the policy-gradient part of the loss (slime/backends/megatron_utils/loss.py l.1081) is
# -ratio x advantage (slime/utils/ppo_utils.py l.133), so it is 0 whenever every advantage is 0, whatever the
# numeric difference between the reference pass and the training pass (which moves the KL term and the grad norm);
# and the mean |training pass - rollout| log-prob difference (loss.py l.1074-1088), which slime's own --ci-test
# bounds by 0.1 (model.py l.892-893). Keys and bound recorded in configs/upstream/rehearsal-keys.json.
PG_LOSS_KEY = "train/pg_loss"
LOGPROB_DIFF_KEY = "train/train_rollout_logprob_abs_diff"
DEFAULT_MAX_LOGPROB_DIFF = 0.1  # report.max_train_rollout_logprob_abs_diff: slime's --ci-test bound (recorded)
DEFAULT_PG_LOSS_TOLERANCE = 1e-6  # report.zero_advantage_pg_loss_tolerance (stated: the expected value is exactly 0)
DEFAULT_MAX_DROPPED_GROUP_SHARE = 0.25  # report.max_dropped_group_share (chosen, not measured)
TIME_GOAL_SECONDS = 15 * 60  # issue 19: under 15 minutes after the download (a goal, not a measurement)
CLASSES = (
    "trainable_tokens",
    "tool_calls",
    "length",
    "sessions",
    "context_limit",
    "reward_spread",
    "no_mixed_rewards",
    "loss_and_grad",
    "logprob_mismatch",
    "weight_sync",
    "checkpoint_resume",
    "supervisor",
    "seven_b_step",
    "seven_b_reload",
    "time_and_tokens",
)
DEFAULT_MAX_FAILED_SESSION_SHARE = 0.25  # report.max_failed_session_share (chosen, not measured)
DEFAULT_MAX_CONTEXT_LIMIT_SHARE = 0.25  # report.max_context_limit_share (chosen, not measured)
# Polar's drops other than zero trainable tokens (trainable_tokens judges those): polarstack.train.gate.polar_drops
DROP_REASONS = {
    "low_complete_fraction": "too few completed sessions (PolarLowCompleteAcceptFractionError)",
    "failed": "a task failure (Polar's worker then stops for a restart)",
    "logprob_error": "logprobs missing or misaligned (RolloutLogprobError)",
    "dynamic_filter": "the dynamic filter",
}


@dataclass
class Verdict:
    name: str
    verdict: str  # pass | warn | fail
    figure: str
    change: str = ""  # what to change, for warn and fail

    def as_dict(self) -> dict[str, str]:
        return {"class": self.name, "verdict": self.verdict, "figure": self.figure, "change": self.change}


def _literal(text: str) -> dict[str, Any] | None:
    """A Python dict repr as slime's f-strings write it; nan/inf (Python's repr of non-finite floats) kept."""
    text = re.sub(r"(?<![\w'\"])(-?)(nan|inf)(?![\w'\"])", lambda m: f"'{m.group(1)}{m.group(2)}'", text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(value, dict):
        return None
    return {k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in value.items()}


def parse_slime_log(text: str) -> dict[str, list[dict[str, Any]]]:
    """slime's per-step and per-rollout log lines: {"steps": [{"step": N, ...}], "perf": [{"rollout": N, ...}]}."""
    out: dict[str, list[dict[str, Any]]] = {"steps": [], "perf": []}
    for line in text.splitlines():
        for pattern, key, field in ((STEP_LINE, "steps", "step"), (PERF_LINE, "perf", "rollout")):
            match = pattern.search(line)
            if match and (values := _literal(match.group(2))) is not None:
                out[key].append({field: int(match.group(1)), **values})
    return out


def read_rollouts(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a killed job
    return rows


def _groups(rollouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [g for r in rollouts for g in r.get("groups", [])]


def _all_groups(rollouts: list[dict[str, Any]]) -> int:
    """Groups Polar generated: those that reached the gate, those it dropped for zero trainable tokens (`dropped`)
    and those it dropped for another reason (`polar_dropped`)."""
    other = sum(float((r.get("polar_dropped") or {}).get(reason) or 0) for r in rollouts for reason in DROP_REASONS)
    return len(_groups(rollouts)) + sum(int(r.get("dropped") or 0) for r in rollouts) + int(other)


def _drop_limit(evidence: dict[str, Any]) -> float:
    return float(evidence.get("max_dropped_group_share", DEFAULT_MAX_DROPPED_GROUP_SHARE))


def trainable_tokens(evidence: dict[str, Any]) -> Verdict:
    """Every group that reached the gate has trainable tokens; the groups Polar dropped for zero trainable tokens stay
    within report.max_dropped_group_share of all groups (a working stack may lose one whose sessions all failed)."""
    rollouts = evidence.get("rollouts") or []
    groups = _groups(rollouts)
    dropped = sum(int(r.get("dropped") or 0) for r in rollouts)
    total = _all_groups(rollouts)
    limit = _drop_limit(evidence)
    if not groups:
        return Verdict(
            "trainable_tokens",
            "fail",
            "no rollout reached the gate",
            "see the job's output (job-train.log) for why no rollout finished; run `make smoke` on this profile",
        )
    empty = sum(1 for g in groups if not g["trainable_tokens"])
    share = dropped / total if total else 0.0
    figure = (
        f"{len(groups) - empty}/{len(groups)} groups with trainable tokens (min "
        f"{min(g['trainable_tokens'] for g in groups)}), {dropped} of {total} groups dropped by Polar for zero "
        f"trainable tokens ({share:.0%})"
    )
    change = "the path loses Polar's token fields or every trace is masked: run `make smoke` against this profile"
    if empty or share > limit:
        return Verdict(
            "trainable_tokens",
            "fail",
            figure + (f" > {limit:.0%} (report.max_dropped_group_share)" if share > limit else ""),
            change,
        )
    if dropped:
        return Verdict(
            "trainable_tokens",
            "warn",
            figure,
            f"within report.max_dropped_group_share={limit:.0%}; if it grows in the real run, {change}",
        )
    return Verdict("trainable_tokens", "pass", figure)


def tool_calls(evidence: dict[str, Any]) -> Verdict:
    groups = _groups(evidence.get("rollouts") or [])
    sessions = sum(g["sessions"] for g in groups)
    with_calls = sum(g["sessions_with_tool_calls"] for g in groups)
    invalid = sum(g["parser_invalid_tool_calls"] for g in groups)
    figure = f"{with_calls}/{sessions} sessions with parsed tool calls, {invalid} traces with an unparsed tool call"
    if not sessions:
        return Verdict("tool_calls", "fail", "no session reached the gate", "see trainable_tokens")
    if not with_calls and invalid:
        return Verdict(
            "tool_calls",
            "fail",
            figure,
            "the engines return tool calls as text: start them with --tool-call-parser (ENGINE_TOOL_CALL_PARSER)",
        )
    if with_calls < sessions:
        return Verdict(
            "tool_calls",
            "warn",
            figure,
            "model shortfall: some sessions never called a tool (a larger rehearsal model, or the real run, may)",
        )
    return Verdict("tool_calls", "pass", figure)


def length(evidence: dict[str, Any]) -> Verdict:
    groups = _groups(evidence.get("rollouts") or [])
    samples = sum(g["samples"] for g in groups)
    lost = sum(g["placeholders"] + g["clipped"] for g in groups)
    share = lost / samples if samples else 0.0
    limit = float(evidence.get("max_dropped_or_clipped_share", 0.5))
    figure = f"{lost}/{samples} samples dropped (no usable trace) or clipped for length ({share:.0%})"
    if samples and share > limit:
        return Verdict(
            "length",
            "fail",
            figure + f" > {limit:.0%}",
            "traces do not fit the budget: raise context.seq_length / grpo.max_tokens_per_gpu or lower "
            "grpo.rollout_max_response_len",
        )
    return Verdict("length", "pass" if samples else "fail", figure, "" if samples else "see trainable_tokens")


def sessions(evidence: dict[str, Any]) -> Verdict:
    """Failed and timed-out sessions (Polar's adapter masks them: FAILED/ABORTED, loss mask 0, remove_sample) and the
    groups Polar's worker dropped for a reason other than zero trainable tokens."""
    rollouts = evidence.get("rollouts") or []
    groups = _groups(rollouts)
    total = sum(g["sessions"] for g in groups)
    failed = sum(int(g.get("sessions_failed", 0)) for g in groups)
    timed_out = sum(int(g.get("sessions_timed_out", 0)) for g in groups)
    drops = {
        reason: sum(float((r.get("polar_dropped") or {}).get(reason) or 0) for r in rollouts) for reason in DROP_REASONS
    }
    limit = float(evidence.get("max_failed_session_share", DEFAULT_MAX_FAILED_SESSION_SHARE))
    share = (failed + timed_out) / total if total else 0.0
    dropped = ", ".join(f"{n:g} for {DROP_REASONS[reason]}" for reason, n in drops.items() if n)
    all_groups = _all_groups(rollouts)
    drop_share = sum(drops.values()) / all_groups if all_groups else 0.0
    drop_limit = _drop_limit(evidence)
    figure = (
        f"{failed}/{total} sessions failed, {timed_out} timed out ({share:.0%} masked or zero-rewarded); groups "
        f"Polar dropped: {dropped or 'none'}" + (f" ({drop_share:.0%} of {all_groups} groups)" if dropped else "")
    )
    change = (
        "sessions end in error or time out, so Polar masks them (loss mask 0, remove_sample) or drops their "
        "group: read the sessions' errors in the run's polar-*.log, and raise the task template's timeout if "
        "they time out (report.max_failed_session_share and report.max_dropped_group_share set the limits)"
    )
    if not total:
        return Verdict("sessions", "fail", figure, "no session reached the gate: see trainable_tokens")
    if share > limit or drop_share > drop_limit:
        return Verdict(
            "sessions",
            "fail",
            figure
            + (f"; {share:.0%} > {limit:.0%}" if share > limit else "")
            + (f"; dropped {drop_share:.0%} > {drop_limit:.0%}" if drop_share > drop_limit else ""),
            change,
        )
    if dropped:  # within report.max_dropped_group_share: a working stack may lose a group
        return Verdict("sessions", "warn", figure, "within report.max_dropped_group_share; " + change)
    return Verdict("sessions", "pass", figure)


def context_limit(evidence: dict[str, Any]) -> Verdict:
    """Sessions that ended because sglang refused a turn whose input + max_tokens passed the context."""
    groups = _groups(evidence.get("rollouts") or [])
    total = sum(g["sessions"] for g in groups)
    ended = sum(int(g.get("sessions_at_context_limit", 0)) for g in groups)
    share = ended / total if total else 0.0
    limit = float(evidence.get("max_context_limit_share", DEFAULT_MAX_CONTEXT_LIMIT_SHARE))
    figure = f"{ended}/{total} sessions ended at the engine's context ({share:.0%})"
    change = (
        "the conversations outgrow the context (sglang refuses input + max_tokens over it, and the session's last "
        'turns are lost): lower the turn cap or context.agent_max_output_tokens (docs/gpu-node.md, "Sequence '
        'length")'
    )
    if not total:
        return Verdict("context_limit", "fail", figure, "no session reached the gate: see trainable_tokens")
    if share > limit:
        return Verdict("context_limit", "fail", figure + f" > {limit:.0%}", change)
    return Verdict("context_limit", "warn" if ended else "pass", figure, change if ended else "")


def _mixed_by_rollout(evidence: dict[str, Any]) -> dict[int, bool]:
    """Per rollout: did any group get mixed rewards (a non-zero advantage)."""
    out: dict[int, bool] = {}
    for row in evidence.get("rollouts") or []:
        rid = int(row.get("rollout_id", -1))
        out[rid] = out.get(rid, False) or any(not g["zero_advantage"] for g in row.get("groups", []))
    return out


def reward_spread(evidence: dict[str, Any]) -> Verdict:
    groups = _groups(evidence.get("rollouts") or [])
    mixed = sum(1 for g in groups if not g["zero_advantage"])
    rewards = [r for g in groups for r in g["rewards"]]
    need = int(evidence.get("min_mixed_reward_groups", 1))
    figure = (
        f"{mixed}/{len(groups)} groups with mixed rewards (zero-advantage share "
        f"{(len(groups) - mixed) / len(groups) if groups else 1:.0%}), {sum(1 for r in rewards if r > 0)}/"
        f"{len(rewards)} samples rewarded"
    )
    if mixed >= need and groups:
        return Verdict("reward_spread", "pass", figure)
    if not mixed:  # its own class decides: a model shortfall or a broken reward path
        return Verdict("reward_spread", "warn", figure, "no group with mixed rewards at all: see no_mixed_rewards")
    return Verdict(
        "reward_spread",
        "warn",
        figure,
        f"model shortfall: fewer than report.min_mixed_reward_groups={need} groups with mixed rewards; the stack may "
        "be fine, but little here proves the reward moves (try a larger model.size in configs/train/preflight.yaml "
        "or other tasks.ids)",
    )


def no_mixed_rewards(evidence: dict[str, Any]) -> Verdict:
    """No group with mixed rewards in any step: GRPO's advantages are all 0, so nothing is learned. A model shortfall
    (a warning) when the verifier gave the canonical answer reward 1 (and a wrong one 0) through the same sandbox
    (`reward_path`, the sandbox probe `make preflight` runs before the jobs); else the reward path is broken."""
    mixed = _mixed_by_rollout(evidence)
    groups = _groups(evidence.get("rollouts") or [])
    if not groups:
        return Verdict("no_mixed_rewards", "fail", "no rollout reached the gate", "see trainable_tokens")
    with_mixed = sum(1 for m in mixed.values() if m)
    figure = f"{with_mixed}/{len(mixed)} rollouts with a group of mixed rewards"
    if with_mixed:
        return Verdict("no_mixed_rewards", "pass", figure)
    rewards = [r for g in groups for r in g["rewards"]]
    path = evidence.get("reward_path") or {}
    proven = path.get("canonical_reward") == 1.0 and path.get("wrong_reward") == 0.0
    figure += (
        f"; {sum(1 for r in rewards if r > 0)}/{len(rewards)} samples rewarded; the verifier through the sandbox: "
        + (
            f"canonical answer reward {path.get('canonical_reward')}, wrong answer {path.get('wrong_reward')} "
            f"({path.get('task', '?')})"
            if path
            else "not run"
        )
    )
    if proven:
        why = "never solved a task" if not any(r > 0 for r in rewards) else "solved every sample of a task alike"
        return Verdict(
            "no_mixed_rewards",
            "warn",
            figure,
            f"model shortfall: no group had mixed rewards in any step (the small model {why}), while the verifier "
            "gives the canonical answer reward 1 through the same sandbox, so the reward path works; nothing here "
            "proves GRPO moves the weights (try a larger model.size in configs/train/preflight.yaml or other tasks.ids)",
        )
    return Verdict(
        "no_mixed_rewards",
        "fail",
        figure,
        "the reward path is broken or unproven: no group had mixed rewards and the verifier did not give the "
        "canonical answer reward 1 (and a wrong one 0) through the agent sandbox; run `make train DRY_RUN=1` and the "
        'sandbox probe (docs/gpu-node.md, "The probe make train runs first")',
    )


def loss_and_grad(evidence: dict[str, Any]) -> Verdict:
    """Every step logged, finite, and its gradient consistent with its rollout's advantages: non-zero with mixed
    rewards; with none (no_mixed_rewards' case) the policy-gradient loss train/pg_loss is -ratio x advantage = 0
    (slime/utils/ppo_utils.py l.133), so |pg_loss| above report.zero_advantage_pg_loss_tolerance is a defect (the
    advantages are not what the rewards say). The gradient norm of such a step is not judged: the KL term moves it
    by the numeric difference between the reference pass and the training pass. Without train/pg_loss in the step
    (another slime), the old rule stands: a non-zero gradient while the actor still equals the reference. Step s
    trains rollout s // steps_per_rollout (slime's accumulated step id)."""
    steps = (evidence.get("slime") or {}).get("steps") or []
    expected = int(evidence.get("expected_steps", 1))
    per_rollout = max(1, int(evidence.get("steps_per_rollout", 1)))
    tolerance = float(evidence.get("zero_advantage_pg_loss_tolerance", DEFAULT_PG_LOSS_TOLERANCE))
    mixed = _mixed_by_rollout(evidence)
    bad, inconsistent, zero_advantage = [], [], []
    moved = False  # an earlier step had mixed rewards: the actor may differ from the reference
    for s in sorted(steps, key=lambda s: s["step"]):
        loss, grad = s.get(LOSS_KEY), s.get(GRAD_KEY)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (loss, grad)):
            bad.append(s)
            continue
        rollout_mixed = mixed.get(s["step"] // per_rollout)
        if rollout_mixed is None:
            if grad <= 0:
                bad.append(s)
        elif rollout_mixed and grad <= 0:
            inconsistent.append(f"step {s['step']}: zero gradient norm with mixed rewards")
        elif not rollout_mixed:
            pg = s.get(PG_LOSS_KEY)
            if isinstance(pg, (int, float)):
                if not math.isfinite(pg) or abs(pg) > tolerance:
                    inconsistent.append(
                        f"step {s['step']}: {PG_LOSS_KEY} {pg} with no mixed rewards (every advantage is 0, so it "
                        f"must be 0 within {tolerance:g})"
                    )
                else:
                    zero_advantage.append(s["step"])
            elif grad > 0 and not moved:
                inconsistent.append(
                    f"step {s['step']}: gradient norm {grad} with no mixed rewards (every advantage is 0) and no "
                    f"{PG_LOSS_KEY} logged"
                )
            else:
                zero_advantage.append(s["step"])
        moved = moved or bool(rollout_mixed)
    figure = f"{len(steps)} training steps logged (expected {expected}); " + (
        ", ".join(f"step {s['step']}: loss {s.get(LOSS_KEY)}, grad norm {s.get(GRAD_KEY)}" for s in steps[:4]) or "none"
    )
    if zero_advantage:
        figure += (
            f"; steps {zero_advantage} had zero advantages and a policy-gradient loss of 0 within {tolerance:g} "
            "(see no_mixed_rewards)"
        )
    if len(steps) < expected or bad:
        return Verdict(
            "loss_and_grad",
            "fail",
            figure,
            "a step with a non-finite loss or a zero gradient norm trains nothing: check the advantages (reward "
            "spread), --lr and the Megatron arguments against the weights' config.json",
        )
    if inconsistent:
        return Verdict(
            "loss_and_grad",
            "fail",
            figure + "; " + "; ".join(inconsistent),
            "the gradient does not follow the advantages: with mixed rewards it must be non-zero (check the loss "
            "mask and --lr), with none the policy-gradient loss must be 0 (slime normalises rewards per group only "
            "when a rollout's sample count equals n_samples_per_prompt x rollout_batch_size; check the batch "
            "settings)",
        )
    return Verdict("loss_and_grad", "pass", figure)


def logprob_mismatch(evidence: dict[str, Any]) -> Verdict:
    """slime's train/train_rollout_logprob_abs_diff, the token-weighted mean |log p(training pass) - log p(engine)|
    of the trained tokens (loss.py l.1074-1088): above report.max_train_rollout_logprob_abs_diff (default 0.1, the
    bound slime's own --ci-test asserts, model.py l.892-893) the engines sample from another model than the one
    trained: wrong or stale weights on an engine, another model's Megatron arguments, or tokens re-tokenized on the
    way. slime logs it only when the samples carry the engine's log probs (rollout_log_probs): not logged is a
    warning (nothing measured), not a failure."""
    steps = (evidence.get("slime") or {}).get("steps") or []
    limit = float(evidence.get("max_train_rollout_logprob_abs_diff", DEFAULT_MAX_LOGPROB_DIFF))
    values = [(s["step"], s.get(LOGPROB_DIFF_KEY)) for s in sorted(steps, key=lambda s: s["step"])]
    logged = [(step, v) for step, v in values if isinstance(v, (int, float))]
    if not logged:
        return Verdict(
            "logprob_mismatch",
            "warn",
            f"no step logged {LOGPROB_DIFF_KEY} ({len(steps)} steps)",
            "slime logs it only when the samples carry the engine's log probs (rollout_log_probs): check that Polar "
            "passes them (--use-tis needs them too)",
        )
    over = [(step, v) for step, v in logged if not math.isfinite(v) or v > limit]
    figure = f"{LOGPROB_DIFF_KEY}: " + ", ".join(f"step {step}: {v:.4g}" for step, v in logged[:6])
    if over:
        return Verdict(
            "logprob_mismatch",
            "fail",
            figure + f"; above {limit:g} at step(s) {', '.join(str(step) for step, _ in over)}",
            "the engines' log probs differ from the trainer's for the same tokens by more than slime's own CI "
            "allows: the engines serve other weights than the trainer trains (check weight_sync, MODEL_PATH of the "
            "engines against model.hf_checkpoint, and the Megatron arguments against config.json)",
        )
    return Verdict("logprob_mismatch", "pass", figure + f" (<= {limit:g})")


def weight_sync(evidence: dict[str, Any]) -> Verdict:
    """Every engine's weight_version changed during each job. slime sends the version with every update
    (slime/ray/actor_group.py l.247-249 for the disk transport, update_weight_from_distributed.py l.343 for NCCL)
    and sglang reports it in GET /model_info. slime's counter restarts at 0 in each job
    (slime/backends/megatron_utils/actor.py l.176), so job 2's last version differs from job 1's only because the
    jobs run different numbers of rollouts (preflight.checks keeps them different)."""
    versions = evidence.get("weight_versions") or {}
    stages = [s for s in ("before", "after_train", "after_resume") if s in versions]
    # Every engine the rehearsal asked (evidence["engines"]: every node's at NODES>1), read or not.
    engines = sorted({*(versions.get("before") or {}), *(evidence.get("engines") or [])})
    if len(stages) < 3 or not engines:
        return Verdict(
            "weight_sync", "fail", f"weight_version read at {stages or 'no stage'}", "the engines' /model_info"
        )
    stale = [
        f"{engine} ({versions['before'].get(engine)} -> {versions['after_train'].get(engine)} -> "
        f"{versions['after_resume'].get(engine)})"
        for engine in engines
        if not (
            versions["before"].get(engine) != versions["after_train"].get(engine)
            and versions["after_train"].get(engine) != versions["after_resume"].get(engine)
        )
    ]
    figure = ", ".join(
        f"{e}: {versions['before'].get(e)} -> {versions['after_train'].get(e)} -> {versions['after_resume'].get(e)}"
        for e in engines
    )
    if stale:
        return Verdict(
            "weight_sync",
            "fail",
            figure,
            f"weights did not reach {', '.join(stale)}: check WEIGHT_SYNC_TRANSPORT and the weight-updates volume "
            "(docs/gpu-facts.md), and the engine logs for 'Start update_weights'",
        )
    return Verdict("weight_sync", "pass", figure)


def checkpoint_resume(evidence: dict[str, Any]) -> Verdict:
    tracker = evidence.get("checkpoint") or {}
    first, more = int(evidence.get("first", 2)), int(evidence.get("after_resume", 1))
    resumed = [r["rollout_id"] for r in evidence.get("rollouts") or [] if r.get("phase") == "resume"]
    figure = (
        f"tracker {tracker.get('after_train')!r} after job 1 (expected {first - 1}), {tracker.get('after_resume')!r} "
        f"after job 2 (expected {first + more - 1}); job 2 ran rollouts {resumed or 'none'} (expected from {first})"
    )
    ok = (
        str(tracker.get("after_train")) == str(first - 1)
        and str(tracker.get("after_resume")) == str(first + more - 1)
        and resumed
        and min(resumed) == first
    )
    if not ok:
        return Verdict(
            "checkpoint_resume",
            "fail",
            figure,
            "the save or the resume did not happen as slime promises: check --save/--save-interval/--load in the "
            "plan and the checkpoints volume",
        )
    return Verdict("checkpoint_resume", "pass", figure)


def supervisor(evidence: dict[str, Any]) -> Verdict:
    """Job 2 ran through the supervisor (polarstack.train.supervise) with one crash injected after its first attempt:
    the supervisor must resume from the checkpoint that attempt wrote, and the second attempt must end with exit 0."""
    sup = evidence.get("supervisor") or {}
    attempts = sup.get("attempts") or []
    figure = (
        ", ".join(
            f"attempt {i + 1}: {'resume' if a.get('resume') else 'fresh'}, exit {a.get('exit')}, checkpoint "
            f"{a.get('checkpoint')}"
            for i, a in enumerate(attempts)
        )
        or "job 2 did not run through the supervisor"
    ) + (f"; the supervisor stopped: {sup['error']}" if sup.get("error") else "")
    ok = (
        len(attempts) == 2
        and attempts[0].get("exit") == sup.get("injected_exit")
        and attempts[0].get("checkpoint") is not None
        and attempts[1].get("resume")
        and attempts[1].get("exit") == 0
    )
    if not ok:
        return Verdict(
            "supervisor",
            "fail",
            figure,
            "the supervisor did not restart the crashed job from its checkpoint once: see job-resume.log and "
            "polarstack.train.supervise's rules (make logs SERVICE=trainer)",
        )
    return Verdict("supervisor", "pass", figure)


def seven_b_step(evidence: dict[str, Any]) -> Verdict:
    """The 7B's train-only step (issue 32 point 8; polarstack.train.preflight.seven_b): slime's debug-train-only on a
    synthetic rollout of full traces ended with exit 0 and logged its step, and the peak used memory nvidia-smi saw
    on each trainer GPU (sampled; the step is the only process on them) against the estimate per trainer GPU
    (polarstack.train.memory): above the card fails, above the estimate warns (the estimate under-counts)."""
    seven = evidence.get("seven_b")
    if seven is None:
        return Verdict("seven_b_step", "fail", "no evidence of the 7B's step", "see the job's output")
    if seven.get("not_planned"):  # a plan without the 7B's parts (NODES>1)
        return Verdict("seven_b_step", "pass", f"not part of this rehearsal: {seven['not_planned']}")
    if seven.get("skipped"):
        return Verdict("seven_b_step", "fail", f"not run: {seven['skipped']}", "see the first failing class")
    peaks = {str(k): float(v) for k, v in (seven.get("peak_gpu_gb") or {}).items()}
    estimate, card = float(seven.get("estimate_gb") or 0), float(seven.get("capacity_gb") or 0)
    steps = seven.get("steps") or 0
    figure = (
        f"exit {seven.get('exit')}, {steps} step(s) logged; peak used memory per trainer GPU "
        + (", ".join(f"GPU {k}: {v:.1f} GB" for k, v in sorted(peaks.items())) or "not sampled")
        + f" (estimate {estimate:.1f} GB, card {card:.1f} GB; nvidia-smi every {seven.get('sample_ms', '?')} ms)"
    )
    if seven.get("exit") != 0 or not steps:
        return Verdict(
            "seven_b_step",
            "fail",
            figure,
            "the 7B did not train one step on full traces: read job-7b-step.log (an out-of-memory error names the "
            "rank; lower grpo.max_tokens_per_gpu with context.seq_length, or set memory.optimizer_offload=on)",
        )
    if not peaks:
        return Verdict(
            "seven_b_step", "warn", figure, "nvidia-smi gave no samples: the step ran, its memory is not measured"
        )
    over_card = [k for k, v in peaks.items() if card and v > card]
    if over_card:
        return Verdict("seven_b_step", "fail", figure, "a trainer GPU ran full: see job-7b-step.log")
    over = [k for k, v in peaks.items() if v > estimate]
    if over:
        return Verdict(
            "seven_b_step",
            "warn",
            figure,
            f"GPU {', '.join(over)} used more than the estimate: the margin is smaller than computed; raise "
            "memory.cuda_context_gb or memory.fragmentation_share so that the estimate covers what was measured",
        )
    return Verdict("seven_b_step", "pass", figure)


def seven_b_reload(evidence: dict[str, Any]) -> Verdict:
    """The 7B's weights reloaded into engine-0 by sglang's POST /update_weights_from_disk (the call slime's disk weight
    sync makes, slime/ray/actor_group.py l.247), its answer a success and GET /model_info showing the new version."""
    seven = evidence.get("seven_b")
    if seven is None:
        return Verdict("seven_b_reload", "fail", "no evidence of the 7B's reload", "see the job's output")
    if seven.get("not_planned"):
        return Verdict("seven_b_reload", "pass", f"not part of this rehearsal: {seven['not_planned']}")
    if seven.get("skipped"):
        return Verdict("seven_b_reload", "fail", f"not run: {seven['skipped']}", "see the first failing class")
    reload = seven.get("reload") or {}
    figure = (
        f"{reload.get('engine', 'engine-0')}: update_weights_from_disk success={reload.get('success')} "
        f"({reload.get('message', '')!s:.120}) in {reload.get('seconds', '?')} s; weight_version "
        f"{reload.get('version_before')!r} -> {reload.get('version_after')!r} (wanted {reload.get('wanted')!r})"
    )
    if reload.get("success") is True and reload.get("version_after") == reload.get("wanted"):
        return Verdict("seven_b_reload", "pass", figure)
    return Verdict(
        "seven_b_reload",
        "fail",
        figure,
        "the engine did not take the 7B's weights from disk as slime's weight sync would give them: read the "
        "engine's log (make logs SERVICE=engine-0) for the tensor it refused (the untied lm_head among them)",
    )


def time_and_tokens(evidence: dict[str, Any]) -> Verdict:
    phases = evidence.get("phases") or {}
    rollouts = evidence.get("rollouts") or []
    tokens = [sum(g["tokens"] for g in r.get("groups", [])) for r in rollouts]
    perf = (evidence.get("slime") or {}).get("perf") or []
    figure = (
        ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
        + (f"; tokens per rollout {', '.join(map(str, tokens))}" if tokens else "; no rollout")
        + (f"; slime rollout time {', '.join(f'{p.get(ROLLOUT_TIME_KEY, 0):.0f} s' for p in perf)}" if perf else "")
    )
    total = sum(phases.values())
    if total > TIME_GOAL_SECONDS:
        return Verdict(
            "time_and_tokens",
            "warn",
            figure,
            f"the rehearsal took {total:.0f} s, above the 15-minute goal; a real rollout costs about "
            "(real rollout_batch_size x n_samples_per_prompt) / (rehearsal's) times the tokens above",
        )
    return Verdict("time_and_tokens", "pass", figure)


JUDGES = (
    trainable_tokens,
    tool_calls,
    length,
    sessions,
    context_limit,
    reward_spread,
    no_mixed_rewards,
    loss_and_grad,
    logprob_mismatch,
    weight_sync,
    checkpoint_resume,
    supervisor,
    seven_b_step,
    seven_b_reload,
    time_and_tokens,
)


def judge(evidence: dict[str, Any]) -> list[Verdict]:
    return [fn(evidence) for fn in JUDGES]


def report(evidence: dict[str, Any]) -> dict[str, Any]:
    verdicts = judge(evidence)
    failed = next((v for v in verdicts if v.verdict == "fail"), None)
    return {
        "passed": failed is None,
        "first_failure": failed.name if failed else None,
        "verdicts": [v.as_dict() for v in verdicts],
    }


NODE_ONLY = "measured by `make preflight` on the node only"
PARSED_OUTCOME, RAW_TEXT_OUTCOME = "parsed", "raw_tool_call_text"  # polarstack.checks.tool_exchange's outcomes


def local_part(trainable_per_exchange: list[int], tool_check: dict[str, Any] | None) -> list[Verdict]:
    """What the local runtime measures of the report (`make demo`): the smoke's exchanges stand for groups
    (Polar's trainable tokens of each), its tool request to every target for the sessions; the rest is the node's."""
    out = []
    empty = sum(1 for t in trainable_per_exchange if not t)
    figure = (
        f"{len(trainable_per_exchange) - empty}/{len(trainable_per_exchange)} smoke exchanges with trainable tokens"
    )
    out.append(
        Verdict(
            "trainable_tokens",
            "fail" if empty or not trainable_per_exchange else "pass",
            figure,
            "the path loses Polar's token fields: the smoke's sentence says which" if empty else "",
        )
    )
    # the unpadded request judges parsing (tool_exchange.judge_tool_calls); the agent-length one only warns there
    targets = [t for t in (tool_check or {}).get("targets") or [] if not t.get("padded")]
    parsed = sum(1 for t in targets if t.get("outcome") == PARSED_OUTCOME)
    raw = sum(1 for t in targets if t.get("outcome") == RAW_TEXT_OUTCOME)
    figure = f"{parsed}/{len(targets)} targets answered the tool request with parsed tool calls"
    if (tool_check or {}).get("not_judged"):
        out.append(
            Verdict(
                "tool_calls",
                "warn",
                f"not judged: {tool_check['not_judged']}",
                "check tool calls on engine-direct or behind a router that forwards unknown request fields",
            )
        )
    elif not targets:
        out.append(Verdict("tool_calls", "fail", "no tool request reached a target", "see the smoke's sentence"))
    elif raw:
        out.append(Verdict("tool_calls", "fail", figure, "start the engines with --tool-call-parser"))
    else:
        out.append(Verdict("tool_calls", "pass" if parsed == len(targets) else "warn", figure))
    out += [Verdict(name, "node", NODE_ONLY) for name in CLASSES if name not in ("trainable_tokens", "tool_calls")]
    return out


def raise_on_failure(result: dict[str, Any]) -> None:
    if result["passed"]:
        return
    verdict = next(v for v in result["verdicts"] if v["class"] == result["first_failure"])
    raise StackError(
        f"the rehearsal failed at {verdict['class']}: {verdict['figure']}; {verdict['change']}.",
        ExitCode.REHEARSAL_FAILED,
    )


__all__ = [
    "local_part",
    "judge",
    "report",
    "raise_on_failure",
    "parse_slime_log",
    "read_rollouts",
    "Verdict",
    "CLASSES",
]
