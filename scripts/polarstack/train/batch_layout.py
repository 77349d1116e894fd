"""The batch layout Megatron and slime accept: global batch, micro-batch, data-parallel size, rollout batch.

Facts (configs/upstream/batch-rules.json, scripts/tools/record_batch_rules.py):
- slime v0.3.1 `slime/backends/megatron_utils/initialize.py` calls Megatron's
  `init_num_microbatches_calculator(rank, rampup, global_batch_size, micro_batch_size, data_parallel_size, ...)`
  even with dynamic batching ("initialize to pass some validation in megatron"); Megatron's
  `ConstantNumMicroBatchesCalculator` asserts `global_batch_size % (micro_batch_size * data_parallel_size) == 0`.
  slime's `--micro-batch-size` defaults to 1 (slime/utils/arguments.py), DP = actor GPUs / (TP x PP x CP).
- with `--num-steps-per-rollout`, slime asserts
  `global_batch_size == rollout_batch_size * n_samples_per_prompt // num_steps_per_rollout` (arguments.py).
- slime's `build_dp_schedule` (slime/utils/dp_schedule.py) makes `len(rollout_ids) // global_batch_size` steps
  per rollout and drops the trailing rollouts that do not fill a step, asserting at least one step.
So `engine-direct` (3 trainer GPUs at TP 1: DP 3) cannot start with global_batch_size 64.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from polarstack.pins import repo_root

RECORD = "configs/upstream/batch-rules.json"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


@dataclass(frozen=True)
class Layout:
    n_samples_per_prompt: int
    rollout_batch_size: int
    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int
    num_steps_per_rollout: int | None = None

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt


def micro_batch_default(facts: dict[str, Any] | None = None) -> int:
    """slime's --micro-batch-size default (the stack never passes the flag)."""
    return int((facts or record())["slime"]["micro_batch_size_default"]["value"])


def data_parallel_size(actor_gpus: int, tp: int, pp: int = 1, cp: int = 1) -> int:
    return actor_gpus // (tp * pp * cp)


def _flag(args: list[str], flag: str) -> int | None:
    return int(args[args.index(flag) + 1]) if flag in args else None


def from_train_args(args: list[str], facts: dict[str, Any] | None = None) -> Layout:
    """The layout train_async.py would see: its flags, slime's recorded micro-batch default when none is passed."""
    facts = facts or record()
    gpus = (_flag(args, "--actor-num-nodes") or 1) * (_flag(args, "--actor-num-gpus-per-node") or 1)
    dp = data_parallel_size(
        gpus,
        _flag(args, "--tensor-model-parallel-size") or 1,
        _flag(args, "--pipeline-model-parallel-size") or 1,
        _flag(args, "--context-parallel-size") or 1,
    )
    mbs = _flag(args, "--micro-batch-size") or micro_batch_default(facts)
    return Layout(
        n_samples_per_prompt=_flag(args, "--n-samples-per-prompt") or 1,
        rollout_batch_size=_flag(args, "--rollout-batch-size") or 1,
        global_batch_size=_flag(args, "--global-batch-size") or 0,
        micro_batch_size=mbs,
        data_parallel_size=dp,
        num_steps_per_rollout=_flag(args, "--num-steps-per-rollout"),
    )


def problems(layout: Layout) -> list[str]:
    """One sentence per rule the layout breaks (no trailing period); [] when Megatron and slime accept it."""
    out = []
    gbs, mbs, dp = layout.global_batch_size, layout.micro_batch_size, layout.data_parallel_size
    n, rbs, samples = layout.n_samples_per_prompt, layout.rollout_batch_size, layout.samples_per_rollout
    if dp < 1:
        out.append(f"the trainer has fewer GPUs than TP x PP x CP: data-parallel size {dp}")
        return out
    if gbs % (mbs * dp):
        out.append(
            f"global_batch_size={gbs} is not divisible by micro_batch_size {mbs} x data-parallel size {dp}: "
            "Megatron's ConstantNumMicroBatchesCalculator (which slime's initialize.py builds) asserts it at start-up"
        )
    if layout.num_steps_per_rollout is not None and gbs != samples // layout.num_steps_per_rollout:
        out.append(
            f"global_batch_size={gbs} is not rollout_batch_size {rbs} x n_samples_per_prompt {n} // "
            f"num_steps_per_rollout {layout.num_steps_per_rollout}: slime's arguments.py asserts it"
        )
    if samples < gbs:
        out.append(
            f"rollout_batch_size {rbs} x n_samples_per_prompt {n} = {samples} is below global_batch_size={gbs}: "
            "slime's build_dp_schedule asserts at least one training step per rollout"
        )
    elif samples % gbs:
        out.append(
            f"rollout_batch_size {rbs} x n_samples_per_prompt {n} = {samples} does not split into whole global "
            f"batches of {gbs}: slime's build_dp_schedule drops the trailing {samples % gbs} trajectories every rollout"
        )
    return out


def valid_choice(layout: Layout) -> str:
    """A nearby layout that satisfies every rule, as `--set` values (n_samples_per_prompt kept)."""
    n, mbs, dp = layout.n_samples_per_prompt, layout.micro_batch_size, max(layout.data_parallel_size, 1)
    unit = math.lcm(n, mbs * dp)  # a global batch must hold whole GRPO groups and whole micro-batch rounds
    samples = layout.samples_per_rollout
    if samples % unit == 0:
        # the largest multiple of unit dividing the rollout's samples that is not above the current global batch
        options = [g for g in range(unit, samples + 1, unit) if samples % g == 0]
        below = [g for g in options if g <= max(layout.global_batch_size, unit)]
        return f"grpo.global_batch_size={(below or options)[-1]}"
    step = unit // math.gcd(unit, n)  # rollout_batch_size must be a multiple of this
    rbs = max(step, round(layout.rollout_batch_size / step) * step)
    return f"grpo.rollout_batch_size={rbs} grpo.global_batch_size={rbs * n}"


__all__ = [
    "Layout",
    "RECORD",
    "data_parallel_size",
    "from_train_args",
    "micro_batch_default",
    "problems",
    "record",
    "valid_choice",
]
