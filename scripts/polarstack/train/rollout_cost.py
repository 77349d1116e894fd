"""What one rollout costs, estimated from the plan (issue 18 point 7); the rehearsal (issue 19) measures it.

A rollout collects rollout_batch_size x n_samples_per_prompt agent trajectories. Polar's prefix-merging builder
turns a trajectory into one trace when every request extends the previous one, and into several when a request
does not (Qwen's chat template re-renders earlier tool calls, so a turn's prompt need not extend the last one).
Each trace starts with the harness prompt (configs/upstream/harness-prompt.json) and is capped at the trace budget
(polarstack.checks.budget: harness + margin + task prompt + response, at most seq_length). So per rollout:
traces >= trajectories, and tokens per trace lie between the harness prompt and that cap; the number of traces
per trajectory is what only a run shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Estimate:
    trajectories: int
    min_tokens_per_trace: int
    max_tokens_per_trace: int

    @property
    def min_tokens(self) -> int:  # one trace per trajectory, each the harness prompt alone
        return self.trajectories * self.min_tokens_per_trace

    @property
    def max_tokens_one_trace_each(self) -> int:
        return self.trajectories * self.max_tokens_per_trace

    def sentence(self) -> str:
        return (
            f"cost per rollout (estimated from the plan, not measured): {self.trajectories} agent trajectories -> at "
            f"least {self.trajectories} traces (more when a turn's prompt does not extend the previous one), each "
            f"{self.min_tokens_per_trace:,}-{self.max_tokens_per_trace:,} tokens: {self.min_tokens:,}-"
            f"{self.max_tokens_one_trace_each:,} tokens at one trace per trajectory, and up to "
            f"{self.max_tokens_one_trace_each:,} more for each further trace per trajectory"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "min_tokens": self.min_tokens,
            "max_tokens_one_trace_each": self.max_tokens_one_trace_each,
        }


def estimate(config: dict[str, Any], harness_prompt_tokens: int) -> Estimate:
    grpo, context = config["grpo"], config["context"]
    cap = harness_prompt_tokens + int(context["harness_margin_tokens"])
    cap += int(grpo["rollout_max_prompt_len"]) + int(grpo["rollout_max_response_len"])
    return Estimate(
        trajectories=int(grpo["rollout_batch_size"]) * int(grpo["n_samples_per_prompt"]),
        min_tokens_per_trace=harness_prompt_tokens,
        max_tokens_per_trace=min(cap, int(context["seq_length"])),
    )


__all__ = ["Estimate", "estimate"]
