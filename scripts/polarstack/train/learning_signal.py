"""The learning signal of one rollout, measured inside the job from the samples Polar hands to slime.

Used by the in-job gate (polarstack.train.gate) after every rollout, for three things:
- a summary line per rollout in `polar_gate_summary_file` (rollouts.jsonl under the run dir), which the
  rehearsal's report reads (polarstack.checks.rehearsal_report);
- metrics added to the rollout's output, which slime logs to its tracker with its own rollout metrics
  (slime/ray/rollout.py at SLIME_COMMIT: `generate` l.560-562 passes `data.metrics` (l.651) to
  `_log_rollout_data`, whose l.1303 starts its log_dict from them; `logging_utils.log` sends it to W&B and/or
  TensorBoard, slime/utils/logging_utils.py l.45-51);
- the zero-advantage watch (`ZeroAdvantageWatch`): GRPO's advantage is a sample's reward against its group's,
  so a group whose samples all got the same reward teaches nothing (slime's own `_compute_zero_std_metrics`,
  slime/ray/rollout.py l.1413-1427, counts such groups as `rollout/zero_std/count_<reward>`).

What a sample carries is Polar's (src/slime_bridge/adapter.py, read at 063c94824aea5ae7f7687acec23f172a552794c1,
the stored revision nearest POLAR_COMMIT; configs/upstream/rehearsal-keys.json): `_build_sample` puts
metadata["polar"] with "session_id", "trace_debug"."response_messages" (the engine-side messages of the trace),
"token_clipping" when it kept only a causal prefix for length, "training_filter"."reason"
"parser_invalid_tool_call" when the tool call did not parse; `_build_dummy_sample` a "placeholder" with
remove_sample when a session had no usable trace; status TRUNCATED when clipped or finish_reason "length".

Sessions that kill learning (issue 26 point 2, configs/upstream/rehearsal-keys.json `session_outcomes`): `_sample_status`
makes a TIMEOUT session ABORTED and an ERROR session (or one with an error) FAILED; `_build_sample` then zeroes the
loss mask, sets remove_sample and training_filter.reason "session_timeout" / "session_error"; an agent-budget timeout
stays trainable with reason "agent_timeout" and reward 0. Every sample also carries "session_status" (the session's).
A session that ran into the engine's context (issue 26 point 4) carries sglang's refusal sentence
(srt/managers/tokenizer_manager.py `_validate_one_request` at SGLANG_VERSION, CONTEXT_LIMIT_MARKERS) in one of the
strings of its metadata: where Polar puts the failed request's error (result_error, trajectory_error, the trajectory's
metadata) is not confirmed, so every string of metadata["polar"] except the trace's own messages is searched.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)
SUMMARY_ATTR = "polar_gate_summary_file"
ZERO_ADVANTAGE_ROLLOUTS_ATTR = "polar_gate_zero_advantage_rollouts"
ZERO_ADVANTAGE_WARN_ATTR = "polar_gate_zero_advantage_warn_share"
DEFAULT_ZERO_ADVANTAGE_ROLLOUTS = 10
DEFAULT_ZERO_ADVANTAGE_WARN_SHARE = 0.75
METRIC_PREFIX = "polarstack/"
PARSER_INVALID = "parser_invalid_tool_call"  # adapter.py _build_sample: training_filter reason
SESSION_ERROR, SESSION_TIMEOUT, AGENT_TIMEOUT = "session_error", "session_timeout", "agent_timeout"  # ... reasons too
# sglang's two refusals for length (tokenizer_manager.py `_validate_one_request`; polarstack.engine.emulator.
# tokenizer_manager.length_problem says them in full); `make verify-offline` finds both in the pinned wheel.
CONTEXT_LIMIT_MARKERS = (
    "Requested token count exceeds the model's maximum context length",
    "is longer than the model's context length",
)


def _polar(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None)
    polar = metadata.get("polar") if isinstance(metadata, dict) else None
    return polar if isinstance(polar, dict) else {}


def _status(sample: Any) -> str:
    status = getattr(sample, "status", "")
    return str(getattr(status, "value", status)).lower()


def tool_calls_in(messages: Any) -> int:
    """Tool calls in a trace's response messages: OpenAI `tool_calls` entries or Anthropic `tool_use` blocks."""
    count = 0
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        count += len(message.get("tool_calls") or [])
        content = message.get("content")
        if isinstance(content, list):
            count += sum(1 for block in content if isinstance(block, dict) and block.get("type") == "tool_use")
    return count


def _texts(value: Any, depth: int = 0):
    if depth > 6:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "trace_debug":  # the model's own messages: not where an engine refusal is reported
                yield from _texts(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value[:50]:
            yield from _texts(item, depth + 1)


def session_outcome(sample: Any) -> str:
    """'failed', 'timed_out', 'context_limit' or 'ok' for the session a sample came from (Polar's adapter marks)."""
    polar = _polar(sample)
    if any(marker in text for text in _texts(polar) for marker in CONTEXT_LIMIT_MARKERS):
        return "context_limit"
    reason = (polar.get("training_filter") or {}).get("reason")
    status = str(polar.get("session_status") or "").upper().rpartition(".")[2]
    if reason == SESSION_ERROR or status == "ERROR" or _status(sample) == "failed":
        return "failed"
    if reason in (SESSION_TIMEOUT, AGENT_TIMEOUT) or status == "TIMEOUT":
        return "timed_out"
    return "ok"


def group_summary(
    group: list[Any], reward_of: Callable[[Any], float], tokens_of: Callable[[list[Any]], int]
) -> dict[str, Any]:
    """One GRPO group: its trainable tokens, rewards, sessions, tool calls, and traces dropped or clipped."""
    kept = [s for s in group if not getattr(s, "remove_sample", False)]
    rewards = [reward_of(s) for s in kept]
    sessions: dict[str, int] = {}
    outcomes: dict[str, str] = {}
    parser_invalid = clipped = placeholders = truncated = 0
    for index, sample in enumerate(group):
        polar = _polar(sample)
        session = str(polar.get("session_id") or f"sample-{index}")
        calls = tool_calls_in((polar.get("trace_debug") or {}).get("response_messages"))
        sessions[session] = sessions.get(session, 0) + calls
        outcome = session_outcome(sample)
        if outcomes.get(session, "ok") == "ok":  # a session's traces share its outcome; the first mark wins
            outcomes[session] = outcome
        if (polar.get("training_filter") or {}).get("reason") == PARSER_INVALID:
            parser_invalid += 1
        clipped += 1 if polar.get("token_clipping") else 0
        placeholders += 1 if polar.get("placeholder") else 0
        truncated += 1 if _status(sample) == "truncated" else 0
    return {
        "samples": len(group),
        "trainable_tokens": tokens_of(group),
        "rewards": rewards,
        "zero_advantage": len(set(rewards)) <= 1,
        "sessions": len(sessions),
        "sessions_with_tool_calls": sum(1 for calls in sessions.values() if calls),
        "sessions_failed": sum(1 for o in outcomes.values() if o == "failed"),
        "sessions_timed_out": sum(1 for o in outcomes.values() if o == "timed_out"),
        "sessions_at_context_limit": sum(1 for o in outcomes.values() if o == "context_limit"),
        "tool_calls": sum(sessions.values()),
        "parser_invalid_tool_calls": parser_invalid,
        "clipped": clipped,
        "placeholders": placeholders,
        "truncated": truncated,
        "response_tokens": sum(int(getattr(s, "response_length", 0) or 0) for s in kept),
        "tokens": sum(len(getattr(s, "tokens", None) or []) for s in kept),
    }


def rollout_summary(
    rollout_id: int,
    groups: list[dict[str, Any]],
    dropped: int,
    seconds: float,
    polar_dropped: dict[str, float] | None = None,
) -> dict[str, Any]:
    """`dropped`: groups Polar dropped for zero trainable tokens; `polar_dropped`: every drop counter Polar's worker
    exported for this rollout (polarstack.train.gate.polar_drops), by reason."""
    return {
        "rollout_id": rollout_id,
        "time": time.time(),
        "seconds": seconds,
        "dropped": dropped,
        "polar_dropped": dict(polar_dropped or {}),
        "groups": groups,
    }


def session_shares(groups: list[dict[str, Any]]) -> dict[str, float]:
    """Shares of a rollout's sessions that failed, timed out, or ended at the engine's context."""
    sessions = sum(g["sessions"] for g in groups) or 1
    return {
        key: sum(int(g.get(f"sessions_{key}", 0)) for g in groups) / sessions
        for key in ("failed", "timed_out", "at_context_limit")
    }


def metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The rollout's learning signal as tracker metrics (names under polarstack/)."""
    groups = summary["groups"]
    rewards = [r for g in groups for r in g["rewards"]]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0
    n = len(groups) or 1
    values = {
        "reward_mean": mean,
        "reward_std": spread,
        "zero_advantage_share": sum(1 for g in groups if g["zero_advantage"]) / n,
        "trainable_tokens_per_group": sum(g["trainable_tokens"] for g in groups) / n,
        "tokens_per_rollout": float(sum(g["tokens"] for g in groups)),
        "sessions_with_tool_calls_share": sum(g["sessions_with_tool_calls"] for g in groups)
        / (sum(g["sessions"] for g in groups) or 1),
        "dropped_zero_trainable_groups": float(summary["dropped"]),
        **{f"sessions_{key}_share": value for key, value in session_shares(groups).items()},
    }
    return {METRIC_PREFIX + key: float(value) for key, value in values.items()}


def write_summary(args: Any, summary: dict[str, Any]) -> None:
    """Append the rollout's line; a file that cannot be written costs the report its evidence, never the job."""
    path = getattr(args, SUMMARY_ATTR, None)
    if not path:
        return
    try:
        with Path(path).open("a", encoding="utf-8") as out:
            out.write(json.dumps(summary) + "\n")
    except OSError as exc:
        logger.warning("polarstack gate: cannot append the rollout summary to %s (%s)", path, exc)


class ZeroAdvantageWatch:
    """Warn when more than `warn_share` of the groups of the last K rollouts have zero advantage; stop when every
    group of K consecutive rollouts has (K = `polar_gate_zero_advantage_rollouts`, 0 switches the stop off)."""

    def __init__(self) -> None:
        self.history: list[tuple[int, int]] = []  # (groups, zero-advantage groups) per rollout

    def reset(self) -> None:
        self.history = []

    def observe(self, args: Any, rollout_id: int, groups: list[dict[str, Any]]) -> tuple[str, str] | None:
        """('warn' | 'stop', sentence) or None."""
        k = int(getattr(args, ZERO_ADVANTAGE_ROLLOUTS_ATTR, DEFAULT_ZERO_ADVANTAGE_ROLLOUTS) or 0)
        share_limit = float(getattr(args, ZERO_ADVANTAGE_WARN_ATTR, DEFAULT_ZERO_ADVANTAGE_WARN_SHARE))
        if k <= 0 or not groups:
            return None
        self.history = (self.history + [(len(groups), sum(1 for g in groups if g["zero_advantage"]))])[-k:]
        total = sum(n for n, _ in self.history)
        zero = sum(z for _, z in self.history)
        if len(self.history) < k:  # a share over fewer than K rollouts says little: judge full windows only
            return None
        if zero == total:
            return (
                "stop",
                f"polarstack gate: stopping the job, every one of the {total} groups of the last {k} rollouts (up to "
                f"rollout {rollout_id}) has zero advantage (all samples of a group got the same reward), so GRPO "
                "learns nothing from them; check the reward path (polar/reward_mean, the evaluator's output), make "
                "the tasks solvable sometimes, or raise grpo.n_samples_per_prompt.",
            )
        if zero / total > share_limit:
            return (
                "warn",
                f"polarstack gate: WARNING {zero} of {total} groups of the last {k} rollouts (up to "
                f"rollout {rollout_id}) have zero advantage (above gate.zero_advantage_warn_share={share_limit:g}).",
            )
        return None


__all__ = [
    "group_summary",
    "rollout_summary",
    "session_outcome",
    "session_shares",
    "metrics",
    "write_summary",
    "ZeroAdvantageWatch",
    "tool_calls_in",
]
