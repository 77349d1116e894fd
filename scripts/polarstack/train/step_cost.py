"""What one GRPO step costs before launch (issue 26 point 8): memory from polarstack.train.memory, and time computed
from stated throughput assumptions (`cost:` in configs/train/defaults.yaml), never measured.

One step here is one rollout and its training (the plans keep one optimizer step per rollout). Its tokens lie in the
range polarstack.train.rollout_cost gives (one trace per trajectory, between the harness prompt and the trace cap).
- Training: a trace of s tokens costs 2 x parameters x s + 2 x layers x hidden x s^2 FLOPs forward (the dense layers,
  and causal attention's scores and values); backward twice that; full recompute one more forward; the reference and
  the old-policy log-probs one forward each: 6 forwards in all. Divided by the trainer GPUs x the assumed achieved
  TFLOPS per GPU.
- At NODES>1 the trainer GPUs and the engines are every node's (the caller passes the engines of the cluster).
- Generation: at most trajectories x rollout_max_response_len output tokens, divided by the engines x the assumed
  output tokens per second per engine (prefill and the agent's tool time not counted: a lower bound on that bound's
  cost, stated as such).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.train.memory import MemoryPlan
from polarstack.train.model_size import model_facts
from polarstack.train.rollout_cost import Estimate

FORWARDS_PER_STEP = 6  # forward + backward (2) + recompute forward + reference and old-policy log-prob forwards


@dataclass(frozen=True)
class StepCost:
    min_train_seconds: float
    max_train_seconds: float
    max_generation_seconds: float
    trainer_tflops: float
    engine_tokens_per_second: float
    trainer_gpus: int
    engines: int
    trainer_gb: float
    gpu_gb: float
    host_gb: float
    offload: bool
    nodes: int = 1  # NODES: trainer_gpus and engines are the cluster's; the memory figures are per node

    def sentence(self) -> str:
        return (
            f"cost per step (computed from stated assumptions, not measured: `cost:` in configs/train/defaults.yaml): "
            f"memory {self.trainer_gb:.1f} GB per trainer GPU of {self.gpu_gb:.1f} (optimizer offload "
            f"{'on' if self.offload else 'off'}), host {self.host_gb:.1f} GB"
            f"{'' if self.nodes == 1 else f' per node of {self.nodes}'}; training "
            f"{self.min_train_seconds:,.0f}-{self.max_train_seconds:,.0f} s over that token range at an assumed "
            f"{self.trainer_tflops:g} TFLOPS per trainer GPU x {self.trainer_gpus}; generation at most "
            f"{self.max_generation_seconds:,.0f} s at an assumed {self.engine_tokens_per_second:g} output tokens/s "
            f"per engine x {self.engines} (agent tool time not counted)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "computed_not_measured": True,
            "min_train_seconds": round(self.min_train_seconds, 1),
            "max_train_seconds": round(self.max_train_seconds, 1),
            "max_generation_seconds": round(self.max_generation_seconds, 1),
            "assumed_trainer_tflops_per_gpu": self.trainer_tflops,
            "assumed_engine_output_tokens_per_second": self.engine_tokens_per_second,
            "trainer_gpu_gb": round(self.trainer_gb, 1),
            "host_gb": round(self.host_gb, 1),
        }


def _positive(config: dict[str, Any], key: str) -> float:
    value = (config.get("cost") or {}).get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise StackError(
            f"cost.{key}={value!r} must be a positive number (configs/train/defaults.yaml).", ExitCode.USAGE
        )
    return float(value)


def trace_flops(facts: dict[str, Any], tokens: int) -> float:
    """FLOPs of one trace's training step (FORWARDS_PER_STEP forwards)."""
    forward = 2 * facts["parameters"] * tokens + 2 * facts["num_layers"] * facts["hidden_size"] * tokens**2
    return FORWARDS_PER_STEP * forward


def estimate(config: dict[str, Any], rollout: Estimate, mem: MemoryPlan, engines: int) -> StepCost:
    tflops = _positive(config, "trainer_tflops_per_gpu")
    rate = _positive(config, "engine_output_tokens_per_second")
    facts = model_facts([str(a) for a in config["model"]["args"]])
    per_second = mem.trainer_gpus * mem.nodes * tflops * 1e12  # every trainer GPU of every node
    response = rollout.trajectories * int(config["grpo"]["rollout_max_response_len"])
    return StepCost(
        min_train_seconds=rollout.trajectories * trace_flops(facts, rollout.min_tokens_per_trace) / per_second,
        max_train_seconds=rollout.trajectories * trace_flops(facts, rollout.max_tokens_per_trace) / per_second,
        max_generation_seconds=response / (max(1, engines) * rate),
        trainer_tflops=tflops,
        engine_tokens_per_second=rate,
        trainer_gpus=mem.trainer_gpus * mem.nodes,
        engines=engines,
        trainer_gb=mem.trainer_gb,
        gpu_gb=mem.capacity.gpu_gb,
        host_gb=mem.host_gb,
        offload=mem.offload,
        nodes=mem.nodes,
    )


__all__ = ["StepCost", "estimate", "trace_flops"]
