"""Does the plan fit the node's memory? Per trainer GPU, per engine GPU and per host, term by term (issue 26 point 1).

Every term is computed from the model's Megatron arguments (polarstack.train.model_size) and the plan, and names the
upstream line it rests on (configs/upstream/memory-facts.json, scripts/tools/record_memory_facts.py; `make
verify-offline` re-reads those lines and recomputes the figures: polarstack.offline.memory_facts). Units: decimal GB
(1e9 bytes), as vendors state card memory ("140 GB"); nvidia-smi's MiB and /proc/meminfo's kB (KiB) are converted.

The trainer GPU (slime at SLIME_COMMIT, one Megatron rank; PP = CP = 1 in this stack):
- weights in bf16 (2 B/parameter) and gradients in fp32 (4 B), divided by TP; slime forces bf16 and the distributed
  optimizer, so the fp32 master weights and Adam's two moments (12 B) are also divided by DP;
- the output layer's logits in fp32 for max_tokens_per_gpu tokens, vocab / TP, and the fp32 softmax the log-prob
  function keeps for backward (its gradient is built in place in that buffer);
- the recompute checkpoints (full recompute: each layer's bf16 input, split by TP under sequence parallel) and one
  layer's activations recomputed in backward with their gradients (an approximation from the layer's shapes);
- allowances from stated figures (issue 34 point 2; `memory:` in configs/train/defaults.yaml, the figures recorded in
  configs/upstream/memory-facts.json): the CUDA context of the rank's process (memory.cuda_context_gb, 1 GB: 781 MB
  measured in pytorch/pytorch#34323), NCCL's buffers (memory.nccl_communicators communicators x NCCL's MAXCHANNELS x
  a ring's 2 connections x the Simple + LL + LL128 buffers of one connection, from NCCL's src/init.cc and
  src/include/device.h: an upper bound, NCCL sets up fewer channels on most topologies), and a share of the computed
  terms for the allocator's fragmentation (memory.fragmentation_share, chosen; the rehearsal's 7B step measures the
  peak against the estimate);
- and then a margin the card must keep beyond every term (memory.min_headroom_share of the card): a plan that fits
  by less is refused, or, with memory.optimizer_offload auto, offloaded.
With slime's own offload flags (--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d
--use-precision-aware-optimizer, as scripts/run-qwen3-30B-A3B.sh), the 12 B of optimizer state move to host memory.
The engine GPU (sglang SGLANG_VERSION): mem_fraction_static x card holds the weights and the KV cache pool; the pool
must hold one full trace (seq_length tokens at kv heads x (head_dim + v_head_dim) x layers x 2 B per token).
The host: slime's pinned-memory backups of the actor and reference weights (each rank's shard), the offloaded
optimizer states with the fp32 gradient copy the CPU optimizer steps on, Ray's object store (its size set by the stack:
`ray start --object-store-memory`, RAY_OBJECT_STORE_GB; issue 32 point 8), and an allowance for the other processes;
checked against /proc/meminfo's MemAvailable (what the node can still give, not MemTotal: page cache it can drop is in
it, memory other processes hold is not).

At NODES > 1 (issue 28) the estimate is per node: each node holds len(TRAINER_GPUS) ranks and its engines, and DP is
NODES x len(TRAINER_GPUS) / TP. What changes per trainer GPU is the one term divided by DP (the distributed
optimizer's states); the weights, gradients, logits, softmax and activations are per rank and stay. Per host, the
weight backups are per rank (the same per node); the offloaded optimizer states and their fp32 gradient copy are
this node's ranks' shards, 1 / NODES of the whole. The engine GPU does not change (each engine holds the whole model).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults, repo_root
from polarstack.stack import ray_head
from polarstack.stack.profiles import Profile, stack_knobs
from polarstack.train.model_size import model_facts

RECORD = "configs/upstream/memory-facts.json"
GB = 1e9
MIB = 1024**2
KIB = 1024
DEFAULT_GPU_MEMORY_GB = 140.0  # the seed's node: 4 x L20X, 140 GB each (../shared/reference/upstream-issue-52.txt)
MEMINFO_ENV = "POLARSTACK_PROC_MEMINFO"  # tests point it at a fake /proc/meminfo
NVIDIA_SMI_ENV = "POLARSTACK_NVIDIA_SMI"  # tests point it at tests/fake_node.py's nvidia-smi (or at none)
OFFLOAD_ARGS = ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
OFFLOAD_MODES = ("auto", "on", "off")
SETTINGS = (
    "optimizer_offload",
    "cuda_context_gb",
    "nccl_communicators",
    "fragmentation_share",
    "min_headroom_share",
    "host_allowance_gb",
)

# Bytes per parameter (slime forces bf16 and the distributed optimizer: memory-facts.json distributed_optimizer, bf16).
BF16 = 2
FP32 = 4
OPTIMIZER_STATE = 12  # fp32 master weights + Adam exp_avg + exp_avg_sq
CHECKPOINT_BYTES = BF16 + OPTIMIZER_STATE  # what one save holds per parameter (bf16 weights + fp32 master + moments)


@functools.lru_cache(maxsize=1)
def record() -> dict[str, Any]:
    """configs/upstream/memory-facts.json (read once; callers must not change it)."""
    return json.loads((repo_root() / RECORD).read_text())


def source(key: str, first: bool = False) -> str:
    """`file:line` of a recorded upstream fact (memory-facts.json), for the printed terms."""
    data = record()
    for side in ("slime", "sglang"):
        if key in data[side]:
            fact = data[side][key]
            lines = ",".join(str(f["line"]) for f in fact["found"][: 1 if first else None])
            return f"{fact['file']}:{lines}"
    raise KeyError(key)


@dataclass(frozen=True)
class Term:
    name: str
    gb: float
    source: str


@dataclass(frozen=True)
class Capacity:
    gpu_gb: float  # the smallest card among the profile's GPUs
    host_gb: float | None  # None: not known here (no GPU node visible and HOST_MEMORY_GB unset)
    source: str


@dataclass
class MemoryPlan:
    profile: str
    model: str
    tensor_parallel: int
    data_parallel: int
    trainer_gpus: int  # per node
    offload: bool
    capacity: Capacity
    trainer: list[Term] = field(default_factory=list)
    engine: list[Term] = field(default_factory=list)
    host: list[Term] = field(default_factory=list)
    margin_gb: float = 0.0  # what a trainer GPU must keep free beyond the estimate (memory.min_headroom_share x card)
    kv_tokens: int = 0  # tokens the engine's KV pool holds
    engine_share_gb: float = 0.0  # mem_fraction_static x card: what sglang reserves for weights + KV pool
    context_tokens: int = 0  # one full trace
    decision: str = ""
    nodes: int = 1  # NODES: the terms are per node (each node alike, polarstack.stack.cluster.layout)

    @property
    def trainer_gb(self) -> float:
        return sum(t.gb for t in self.trainer)

    @property
    def engine_gb(self) -> float:
        return sum(t.gb for t in self.engine)

    @property
    def host_gb(self) -> float:
        return sum(t.gb for t in self.host)

    def problems(self) -> list[str]:
        cap = self.capacity
        out = []
        if self.trainer_gb > cap.gpu_gb:
            out.append(f"a trainer GPU needs {self.trainer_gb:.1f} GB and the card has {cap.gpu_gb:.1f} GB")
        elif self.trainer_gb + self.margin_gb > cap.gpu_gb:
            out.append(
                f"a trainer GPU needs {self.trainer_gb:.1f} GB of the card's {cap.gpu_gb:.1f} GB, leaving "
                f"{cap.gpu_gb - self.trainer_gb:.2f} GB, less than the {self.margin_gb:.1f} GB margin the plan keeps "
                "(memory.min_headroom_share)"
            )
        if self.engine[0].gb >= self.engine_share_gb:
            out.append(
                f"an engine's weights ({self.engine[0].gb:.1f} GB) do not fit its mem_fraction_static share "
                f"({self.engine_share_gb:.1f} GB of {cap.gpu_gb:.1f} GB)"
            )
        elif self.kv_tokens < self.context_tokens:
            out.append(
                f"an engine's KV cache holds {self.kv_tokens:,} tokens, fewer than one {self.context_tokens:,}-token "
                "trace"
            )
        if cap.host_gb is not None and self.host_gb > cap.host_gb:
            out.append(f"the host needs {self.host_gb:.1f} GB and has {cap.host_gb:.1f} GB available")
        return out

    def lines(self) -> list[str]:
        """The estimate as printed by `make train` / `make up` / `make preflight` (computed, never measured)."""
        cap = self.capacity
        host_cap = (
            f"{cap.host_gb:.1f} GB available" if cap.host_gb is not None else "not checked here (set HOST_MEMORY_GB)"
        )
        per_node = (
            ""
            if self.nodes == 1
            else f", per node of {self.nodes} (each: {self.trainer_gpus} trainer GPUs, its engines)"
        )
        out = [
            f"memory (computed from the plan, not measured; decimal GB): {self.model}, profile {self.profile}"
            f"{per_node}, TP {self.tensor_parallel} x DP {self.data_parallel}, optimizer offload "
            f"{'on' if self.offload else 'off'} ({self.decision}); capacity: {cap.gpu_gb:.1f} GB per GPU, host "
            f"{host_cap} ({cap.source})"
        ]
        left = (
            f" ({cap.gpu_gb - self.trainer_gb:.1f} GB left; the plan keeps at least {self.margin_gb:.1f} GB: "
            "memory.min_headroom_share)"
        )
        for title, terms, total, limit, note in (
            ("per trainer GPU", self.trainer, self.trainer_gb, f"{cap.gpu_gb:.1f}", left),
            ("per engine GPU", self.engine, self.engine_gb, f"{cap.gpu_gb:.1f}", ""),
            ("per host", self.host, self.host_gb, f"{cap.host_gb:.1f}" if cap.host_gb is not None else "?", ""),
        ):
            out.append(f"memory {title}: {total:.1f} of {limit} GB{note}")
            out += [f"  {t.gb:8.2f} GB  {t.name}  [{t.source}]" for t in terms]
        out.append(
            f"memory per engine GPU: the KV pool holds {self.kv_tokens:,} tokens ({self.kv_tokens // max(1, self.context_tokens)} "
            f"full {self.context_tokens:,}-token traces)"
        )
        return out

    def as_dict(self) -> dict[str, Any]:
        def terms(items: list[Term]) -> list[dict[str, Any]]:
            return [{"name": t.name, "gb": round(t.gb, 3), "source": t.source} for t in items]

        # "nodes" and "per_node" only at NODES>1: the single-node --json keeps its keys.
        multi = (
            {"nodes": self.nodes, "per_node": True, "trainer_gpus_per_node": self.trainer_gpus}
            if self.nodes > 1
            else {}
        )
        return {
            "profile": self.profile,
            "model": self.model,
            "tensor_parallel": self.tensor_parallel,
            "data_parallel": self.data_parallel,
            **multi,
            "offload": self.offload,
            "decision": self.decision,
            "capacity": {
                "gpu_gb": self.capacity.gpu_gb,
                "host_gb": self.capacity.host_gb,
                "source": self.capacity.source,
            },
            "trainer_gpu": {
                "total_gb": round(self.trainer_gb, 3),
                "terms": terms(self.trainer),
                "headroom_gb": round(self.capacity.gpu_gb - self.trainer_gb, 3),
                "margin_gb": round(self.margin_gb, 3),
            },
            "engine_gpu": {
                "total_gb": round(self.engine_gb, 3),
                "terms": terms(self.engine),
                "kv_tokens": self.kv_tokens,
            },
            "host": {"total_gb": round(self.host_gb, 3), "terms": terms(self.host)},
        }


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    memory = config.get("memory") or {}
    missing = [k for k in SETTINGS if k not in memory]
    if missing:
        raise StackError(f"memory.{missing[0]} is missing from configs/train/defaults.yaml.", ExitCode.USAGE)
    if memory["optimizer_offload"] not in OFFLOAD_MODES:
        raise StackError(
            f"memory.optimizer_offload={memory['optimizer_offload']!r} must be one of {', '.join(OFFLOAD_MODES)}.",
            ExitCode.USAGE,
        )
    for key in ("cuda_context_gb", "fragmentation_share", "host_allowance_gb", "min_headroom_share"):
        value = memory[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise StackError(f"memory.{key}={value!r} must be a non-negative number.", ExitCode.USAGE)
    if memory["min_headroom_share"] >= 1:
        raise StackError(
            f"memory.min_headroom_share={memory['min_headroom_share']!r} must be below 1 (a share of the card).",
            ExitCode.USAGE,
        )
    count = memory["nccl_communicators"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise StackError(f"memory.nccl_communicators={count!r} must be a non-negative integer.", ExitCode.USAGE)
    return memory


def nccl_gb(communicators: int, data: dict[str, Any] | None = None) -> float:
    """NCCL's buffers on one rank: communicators x MAXCHANNELS x 2 ring connections (receive from the previous rank,
    send to the next) x one connection's Simple + LL + LL128 buffers (configs/upstream/memory-facts.json nccl)."""
    nccl = (data or record())["nccl"]
    return communicators * int(nccl["max_channels"]) * 2 * int(nccl["bytes_per_connection"]["total"]) / GB


def trainer_terms(
    facts: dict[str, Any], *, tp: int, dp: int, tokens: int, offload: bool, settings: dict[str, Any]
) -> list[Term]:
    p, vocab, hidden = facts["parameters"], facts["vocab_size"], facts["hidden_size"]
    layers, ffn = facts["num_layers"], facts["ffn_hidden_size"]
    kv = facts["num_query_groups"] * (hidden // facts["num_attention_heads"])
    sp = tp if tp > 1 else 1  # the stack passes --sequence-parallel whenever TP > 1 (train.plan)
    terms = [
        Term("actor weights, bf16: 2 B x parameters / TP", BF16 * p / tp / GB, source("bf16")),
        Term(
            "gradients, fp32 (Megatron's main grads under bf16): 4 B x parameters / TP",
            FP32 * p / tp / GB,
            source("bf16"),
        ),
        Term(
            "optimizer states (fp32 master, exp_avg, exp_avg_sq): 12 B x parameters / TP / DP"
            + (" -> host (offloaded)" if offload else ""),
            0.0 if offload else OPTIMIZER_STATE * p / tp / dp / GB,
            source("distributed_optimizer") + (f"; {source('offload_flags')}" if offload else ""),
        ),
        Term(
            f"logits, fp32: {tokens:,} tokens (max_tokens_per_gpu) x {vocab:,} vocab / TP x 4 B",
            tokens * vocab / tp * FP32 / GB,
            f"{source('logits_fp32')}; {source('loss_asserts_fp32')}",
        ),
        Term(
            "softmax kept for backward, fp32, same size (its gradient is built in place)",
            tokens * vocab / tp * FP32 / GB,
            f"{source('softmax_saved_for_backward')}; {source('gradient_reuses_softmax')}",
        ),
        Term(
            f"recompute checkpoints: {layers} layers x {tokens:,} tokens"
            + (f" / TP {sp} (sequence parallel)" if sp > 1 else "")
            + f" x {hidden:,} hidden x 2 B",
            layers * tokens / sp * hidden * BF16 / GB,
            "context.recompute (--recompute-granularity full): each layer's bf16 input",
        ),
        Term(
            "one layer recomputed in backward, bf16, with its gradients (approximation: 2 norms, q/k/v, attention "
            "output, SwiGLU 3 x ffn)",
            2 * tokens * (2 * hidden + hidden + 2 * kv + hidden + 3 * ffn) / tp * BF16 / GB,
            "computed from the layer's shapes (not an upstream line)",
        ),
    ]
    subtotal = sum(t.gb for t in terms)
    nccl = record()["nccl"]
    per_connection = int(nccl["bytes_per_connection"]["total"])
    terms += [
        Term(
            "allowance: the CUDA context of the rank's process (781 MB measured, rounded up)",
            float(settings["cuda_context_gb"]),
            f"memory.cuda_context_gb; {record()['cuda_context']['source']}",
        ),
        Term(
            f"allowance: NCCL buffers, {settings['nccl_communicators']} communicators x {nccl['max_channels']} channels "
            f"(MAXCHANNELS, an upper bound) x 2 ring connections x {per_connection:,} B (Simple + LL + LL128)",
            nccl_gb(int(settings["nccl_communicators"])),
            f"memory.nccl_communicators; nccl {nccl['tag']} "
            + "; ".join(
                f"{f['file']}:{f['found'][0]['line']}"
                for k, f in nccl["facts"].items()
                if k.startswith(("DEFAULT_", "MAXCH"))
            ),
        ),
        Term(
            f"allowance: allocator fragmentation, {settings['fragmentation_share']:.0%} of the computed terms (chosen)",
            subtotal * float(settings["fragmentation_share"]),
            "memory.fragmentation_share",
        ),
    ]
    return terms


def engine_terms(facts: dict[str, Any], *, mem_fraction: float, gpu_gb: float) -> tuple[list[Term], int]:
    """The engine's reserved share (weights + KV pool, by sglang's definition) and the KV pool's tokens."""
    weights = BF16 * facts["parameters"] / GB
    reserved = mem_fraction * gpu_gb
    head_dim = facts["hidden_size"] // facts["num_attention_heads"]
    cell = facts["num_query_groups"] * (head_dim + head_dim) * facts["num_layers"] * BF16  # bytes per token
    pool = max(0.0, reserved - weights)
    return (
        [
            Term("engine weights, bf16: 2 B x parameters (engine TP 1)", weights, source("mem_fraction_static")),
            Term(
                f"KV cache pool: mem_fraction_static {mem_fraction} x card - weights ({cell:,} B per token)",
                pool,
                f"{source('mem_fraction_static')}; {source('kv_cell_size', first=True)}",
            ),
        ],
        int(pool * GB // cell),
    )


def host_terms(
    facts: dict[str, Any],
    *,
    tp: int,
    gpus: int,
    offload: bool,
    settings: dict[str, Any],
    nodes: int = 1,
    object_store: float = 0.0,
) -> list[Term]:
    """`gpus`: this node's trainer ranks; `nodes`: NODES (the offloaded shards of the whole DP spread over them)."""
    p = facts["parameters"]
    terms = [
        Term(
            f"weight backups (actor and reference), pinned, bf16: 2 x 2 B x parameters / TP x {gpus} trainer ranks",
            2 * BF16 * p / tp * gpus / GB,
            f"{source('backup_in_pinned_host_memory')}; actor {source('actor_backup')}; ref {source('ref_backup')}",
        )
    ]
    if offload:
        share = "" if nodes == 1 else f" / {nodes} nodes"
        whose = "all ranks' shards" if nodes == 1 else "this node's ranks' shards"
        terms += [
            Term(
                f"offloaded optimizer states: 12 B x parameters{share} ({whose})",
                OPTIMIZER_STATE * p / nodes / GB,
                source("offload_flags"),
            ),
            Term(
                f"fp32 gradient copy the CPU optimizer steps on: 4 B x parameters{share} (stated: Megatron's "
                "HybridDeviceOptimizer pins CPU grads; not recorded)",
                FP32 * p / nodes / GB,
                "Megatron HybridDeviceOptimizer (pin_cpu_grads), not recorded",
            ),
        ]
    terms.append(
        Term(
            f"Ray's object store: ray start --object-store-memory ({ray_head.OBJECT_STORE_KNOB}, set by the stack)",
            object_store,
            f"configs/stack.env {ray_head.OBJECT_STORE_KNOB}; polarstack.stack.ray_head",
        )
    )
    terms.append(
        Term(
            "allowance: Ray's other processes, Polar, agent sandboxes, engines' host side (chosen)",
            float(settings["host_allowance_gb"]),
            "memory.host_allowance_gb",
        )
    )
    return terms


def estimate(
    config: dict[str, Any],
    profile: Profile,
    tp: int,
    *,
    offload: bool,
    capacity: Capacity,
    mem_fraction: float,
    nodes: int = 1,
) -> MemoryPlan:
    """One node's memory; `nodes` (NODES) alike nodes share the data parallelism (DP = nodes x GPUs / TP)."""
    settings = _settings(config)
    facts = model_facts([str(a) for a in config["model"]["args"]])
    gpus = len(profile.trainer_gpus)
    dp = nodes * gpus // tp
    plan = MemoryPlan(
        profile=profile.name,
        model=str(config["model"]["name"]),
        tensor_parallel=tp,
        data_parallel=dp,
        trainer_gpus=gpus,
        offload=offload,
        capacity=capacity,
        context_tokens=int(config["context"]["seq_length"]),
        nodes=nodes,
    )
    plan.trainer = trainer_terms(
        facts, tp=tp, dp=dp, tokens=int(config["grpo"]["max_tokens_per_gpu"]), offload=offload, settings=settings
    )
    plan.margin_gb = float(settings["min_headroom_share"]) * capacity.gpu_gb
    plan.engine, plan.kv_tokens = engine_terms(facts, mem_fraction=mem_fraction, gpu_gb=capacity.gpu_gb)
    plan.engine_share_gb = mem_fraction * capacity.gpu_gb
    plan.host = host_terms(
        facts,
        tp=tp,
        gpus=gpus,
        offload=offload,
        settings=settings,
        nodes=nodes,
        object_store=ray_head.object_store_gb(),
    )
    return plan


# --- what the node has -------------------------------------------------------------------------------------------


def _knob_gb(values: dict[str, str], key: str) -> float | None:
    raw = (values.get(key) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise StackError(f"{key}={raw!r} must be a positive number of GB (configs/stack.env).", ExitCode.USAGE)
    return value


def gpu_memory_mib(gpus: list[int]) -> list[float] | None:
    """nvidia-smi's memory.total (MiB) of the given GPUs, or None when no GPU is visible."""
    binary = shutil.which(os.environ.get(NVIDIA_SMI_ENV) or "nvidia-smi")
    if binary is None:
        return None
    proc = subprocess.run(
        [binary, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return None
    found = {}
    for line in proc.stdout.splitlines():
        index, _, total = line.partition(",")
        try:
            found[int(index.strip())] = float(total.strip())
        except ValueError:
            continue
    values = [found[g] for g in gpus if g in found]
    return values or None


def meminfo_kib(path: Path | None = None) -> dict[str, float]:
    """/proc/meminfo's fields in kB ({} when unreadable)."""
    path = path or Path(os.environ.get(MEMINFO_ENV) or "/proc/meminfo")
    out: dict[str, float] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, rest = line.partition(":")
            try:
                out[key.strip()] = float(rest.split()[0])
            except (IndexError, ValueError):
                continue
    except OSError:
        return {}
    return out


def host_memory_kib(path: Path | None = None) -> float | None:
    """MemAvailable (kB): what the host can still give the plan (issue 32 point 8: MemTotal counts memory other
    processes hold); None when /proc/meminfo has no MemAvailable (kernels before 3.14)."""
    return meminfo_kib(path).get("MemAvailable")


def node_capacity(profile: Profile, values: dict[str, str] | None = None) -> Capacity:
    """nvidia-smi's and /proc/meminfo's totals on a GPU node; else GPU_MEMORY_GB (default 140) and HOST_MEMORY_GB."""
    values = values if values is not None else stack_knobs()
    mib = gpu_memory_mib(sorted({*profile.engine_gpus, *profile.trainer_gpus}))
    if mib is not None:
        info = meminfo_kib()
        kib = info.get("MemAvailable")
        total = f", MemTotal {info['MemTotal']:,.0f} kB" if "MemTotal" in info else ""
        return Capacity(
            min(mib) * MIB / GB,
            kib * KIB / GB if kib is not None else None,
            f"nvidia-smi memory.total {min(mib):,.0f} MiB, /proc/meminfo MemAvailable"
            + (f" {kib:,.0f} kB{total}" if kib is not None else " unreadable"),
        )
    gpu = _knob_gb(values, "GPU_MEMORY_GB") or DEFAULT_GPU_MEMORY_GB
    host = _knob_gb(values, "HOST_MEMORY_GB")
    return Capacity(gpu, host, "no GPU visible: GPU_MEMORY_GB" + (", HOST_MEMORY_GB" if host is not None else ""))


def mem_fraction(values: dict[str, str] | None = None) -> float:
    values = values if values is not None else stack_knobs()
    raw = values.get("ENGINE_MEM_FRACTION") or "0.8"
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise StackError(f"ENGINE_MEM_FRACTION={raw!r} must be a number between 0 and 1.", ExitCode.USAGE)
    return value


def decide(
    config: dict[str, Any], profile: Profile, tp: int, capacity: Capacity | None = None, *, nodes: int = 1
) -> MemoryPlan:
    """The plan's memory with the offload choice: without offload when it fits; with slime's offload flags when only
    the offloaded estimate fits (memory.optimizer_offload auto); else refuse, naming the numbers. At NODES>1
    (`nodes`) per node, against this node's capacity (the cluster check compares every node's report with it)."""
    capacity = capacity or node_capacity(profile)
    mode = _settings(config)["optimizer_offload"]
    fraction = mem_fraction()
    plain = estimate(config, profile, tp, offload=False, capacity=capacity, mem_fraction=fraction, nodes=nodes)
    offloaded = estimate(config, profile, tp, offload=True, capacity=capacity, mem_fraction=fraction, nodes=nodes)
    if mode == "off" or (mode == "auto" and not plain.problems()):
        chosen = plain
        chosen.decision = "fits without offload" if mode == "auto" else "memory.optimizer_offload=off"
    else:
        chosen = offloaded
        chosen.decision = (
            "memory.optimizer_offload=on"
            if mode == "on"
            else f"without offload {plain.problems()[0]}; slime's offload flags added"
        )
    problems = chosen.problems()
    if problems:
        tried = "" if mode != "auto" or chosen is plain else f"; without offload {plain.problems()[0]}"
        raise StackError(
            f"profile {profile.name} does not fit this node's memory ({capacity.source}): {problems[0]} "
            f"({'with' if chosen.offload else 'without'} optimizer offload{tried}; docs/gpu-node.md, Memory, has "
            "every term); use larger cards, or lower grpo.max_tokens_per_gpu with context.seq_length.",
            ExitCode.ENVIRONMENT,
        )
    return chosen


def check_up(profile: Profile, config: dict[str, Any] | None = None, *, nodes: int = 1) -> MemoryPlan:
    """`make up`: the memory of the run `make train` would launch on this profile (configs/train/defaults.yaml), so a
    node that cannot hold it is refused before the engines load (refuses like `decide`); per node at NODES>1."""
    config = config or load_defaults()
    section = config["parallel"].get(profile.name) or config["parallel"]["default"]
    return decide(config, profile, int(section["tensor_model_parallel_size"]), nodes=nodes)


def train_args(plan: MemoryPlan, config: dict[str, Any]) -> list[str]:
    """slime's offload flags when chosen, and --log-probs-chunk-size: it chunks the log-probs of every pass, the
    training pass's too (memory-facts.json log_probs_chunk_size_in_loss), which bounds one chunk's temporaries; what
    backward keeps (each chunk's saved softmax, T x V in all) and the fp32 logits are counted whole either way."""
    chunk = (config.get("memory") or {}).get("log_probs_chunk_size")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
        raise StackError(f"memory.log_probs_chunk_size={chunk!r} must be a positive integer.", ExitCode.USAGE)
    return [*(OFFLOAD_ARGS if plan.offload else []), "--log-probs-chunk-size", str(chunk)]


__all__ = ["Capacity", "MemoryPlan", "OFFLOAD_ARGS", "Term", "decide", "estimate", "node_capacity", "train_args"]
