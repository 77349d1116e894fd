"""verify-offline, memory (issue 26 points 1 and 5): the recorded upstream lines say what the memory model assumes,
and the estimate recomputed from them here, apart from polarstack.train.memory, agrees with what the plan prints.

configs/upstream/memory-facts.json (scripts/tools/record_memory_facts.py) holds, at SLIME_COMMIT and SGLANG_VERSION:
slime forcing the distributed optimizer and bf16, the actor built by Megatron's get_model (fp32 logits under --bf16) and
slime's log-prob kernel in fp32, the softmax saved for backward and reused in place as the gradient,
--log-probs-chunk-size's default, the values slime's scripts use, and its reach into the training pass (policy loss ->
get_log_probs_and_entropy -> chunks, each saving its own softmax, so the saved softmax is T x V whatever the chunk),
slime's offload flags, the pinned host backups of the actor and reference weights, save_model saving the optimizer
(what one checkpoint holds), the absence of a retention option, sglang's definition of mem_fraction_static and its KV
bytes per token; and (issue 34 point 2) NCCL's buffer sizes per connection and MAXCHANNELS at a release tag, from
which the NCCL allowance is recomputed here, and the public CUDA-context measurement the context allowance covers.
"""

from __future__ import annotations

import re
from typing import Any

from polarstack.errors import StackError
from polarstack.offline.check import Check
from polarstack.paths import load_defaults
from polarstack.pins import pins
from polarstack.stack import profiles
from polarstack.stack.cluster import Cluster
from polarstack.train import memory, retention
from polarstack.train.model_size import model_facts
from polarstack.train.plan import build_plan, weight_sync_on_disk

# fact key -> what its recorded line must contain for the model to hold
MEANING = {
    "distributed_optimizer": ("use_distributed_optimizer = True", "optimizer states are sharded by DP"),
    "bf16": ("args.bf16 = not args.fp16", "weights are bf16 (2 B) unless --fp16"),
    "logits_fp32": (
        "model = get_model(get_model_provider_func(args, role)",
        "the actor is built by Megatron's get_model (Float16Module under --bf16: fp32 outputs from the last stage)",
    ),
    "log_prob_kernel_fp32": ("vocab_parallel_logits.float()", "slime's log-prob kernel computes in fp32"),
    "loss_asserts_fp32": ("torch.float32", "the loss requires fp32 logits"),
    "softmax_saved_for_backward": ("log_prob_softmax", "the fp32 softmax is kept for backward"),
    "gradient_reuses_softmax": ("log_prob_softmax.neg_()", "the logits' gradient is built in the softmax's buffer"),
    "log_probs_chunk_size_default": ("default=-1", "slime computes log-probs in one piece by default"),
    "backup_in_pinned_host_memory": (
        'device=torch.device("cpu"), pin_memory=True',
        "weight backups live in host memory",
    ),
    "actor_backup": ('backup("actor")', "slime backs up the actor's weights"),
    "ref_backup": ('load_other_checkpoint("ref"', "slime loads (and backs up) the reference weights"),
    "save_model": ("self.optimizer", "a save holds the optimizer's state as well as the weights"),
    "weight_sync_full_hf_copy": ("save_hf_model_to_path(", "each disk weight sync writes a full HF copy"),
    "weight_sync_copy_removed": (
        "if not self.args.update_weight_disk_keep_files:\nshutil.rmtree(disk_weight_dir",
        "the copy is removed after the reload unless --update-weight-disk-keep-files",
    ),
    "mem_fraction_static": ("(model weights + KV cache pool) / GPU memory capacity", "sglang's reserved share"),
    "kv_cell_size": ("(model_config.head_dim + model_config.v_head_dim)", "sglang's KV bytes per token"),
}


def _lines(data: dict[str, Any], key: str) -> list[str]:
    side = "sglang" if key in data["sglang"] else "slime"
    return [f.get("text", "") for f in data[side].get(key, {}).get("found", [])]


# fact key -> (the function its line must be in, what that means): --log-probs-chunk-size in the training pass
WHERE = {
    "logits_fp32": ("setup_model_and_optimizer", "the actor's model (not the critic's value head) is what is built"),
    "loss_asserts_fp32": ("get_log_probs_and_entropy", "the training pass's log-probs require fp32 logits"),
    "log_probs_chunk_size_in_loss": (
        "get_log_probs_and_entropy",
        "--log-probs-chunk-size reaches the log-probs of every pass, the training pass's included",
    ),
    "training_pass_calls_log_probs": (
        "policy_loss_function",
        "the training pass (the policy loss, with gradients) computes its log-probs through it",
    ),
    "log_probs_chunked": ("calculate_log_probs_and_entropy", "the logits are split into chunks of that size"),
    "chunk_saves_softmax": (
        "_calculate_log_probs_and_entropy_chunk",
        "each chunk runs through the autograd function that saves its softmax, so the saved chunks add up to T x V",
    ),
}
# A line that must not stand for the actor's logits: slime's critic value head (model_provider.py LinearForLastLayer).
CRITIC_HEAD = "slime/backends/megatron_utils/model_provider.py"


def fact_problems(data: dict[str, Any] | None = None) -> list[str]:
    data = data or memory.record()
    problems = []
    pinned = pins()
    if data.get("slime_commit") != pinned["SLIME_COMMIT"] or data.get("sglang_version") != pinned["SGLANG_VERSION"]:
        problems.append(
            f"{memory.RECORD} was recorded at other pins than SLIME_COMMIT / SGLANG_VERSION; rerun "
            "scripts/tools/record_memory_facts.py"
        )
    for key, (needle, meaning) in MEANING.items():
        lines = _lines(data, key)
        if key == "kv_cell_size":  # the first match is the plain (not MLA, not fp4) branch the model uses
            lines = lines[:1]
        if not any(needle in line for line in lines):
            problems.append(f"{memory.RECORD} {key}: no recorded line contains {needle!r}, so not: {meaning}")
    for key, (function, meaning) in WHERE.items():
        found = data["slime"].get(key, {}).get("found", [])
        if not any(f.get("in") == function for f in found):
            places = sorted({(f.get("in") or "module level") if "in" in f else "no named function" for f in found})
            places = places or ["nowhere"]
            problems.append(
                f"{memory.RECORD} {key}: recorded in {', '.join(places)}, not in {function}, so not: {meaning}"
            )
    if data["slime"].get("logits_fp32", {}).get("file") == CRITIC_HEAD:
        problems.append(
            f"{memory.RECORD} logits_fp32 cites {CRITIC_HEAD}, the critic's value head (LinearForLastLayer), which GRPO "
            "never builds: the actor's fp32 logits come from Megatron's get_model (model.py); rerun "
            "scripts/tools/record_memory_facts.py"
        )
    flags = [line.strip() for line in _lines(data, "offload_flags")]
    if flags != memory.OFFLOAD_ARGS:
        problems.append(f"slime's offload flags are {flags}, the stack adds {memory.OFFLOAD_ARGS}")
    used = {row["value"] for row in data["slime"]["log_probs_chunk_size_used"]["found"]}
    chunk = load_defaults()["memory"]["log_probs_chunk_size"]
    if chunk not in used:
        problems.append(f"memory.log_probs_chunk_size={chunk} is not a value slime's scripts use ({sorted(used)})")
    if data["slime"]["no_retention_option"]["matches"]:
        problems.append(
            f"slime now has a checkpoint retention option ({data['slime']['no_retention_option']['matches']}); "
            "use it instead of polarstack.train.retention"
        )
    return problems


def weight_sync_problems(name: str, plan, config: dict[str, Any]) -> list[str]:
    """With the disk transport the disk check must count one weight-sync copy (2 B x parameters, the recorded
    save_hf_model_to_path), and the plan must not keep every copy (--update-weight-disk-keep-files)."""
    if not weight_sync_on_disk(plan.train_args):
        return []
    problems = []
    if "--update-weight-disk-keep-files" in plan.train_args:
        problems.append(f"profile {name}: --update-weight-disk-keep-files keeps every weight-sync copy on disk")
    copy = 2 * model_facts([str(a) for a in config["model"]["args"]])["parameters"]
    saves = retention.peak_saves(config) * retention.save_gb(config) * 1e9
    just_short = int(saves + copy) - 1
    if retention.disk_problem(config, just_short, False, weight_sync_on_disk=True) is None:
        problems.append(f"profile {name}: the disk check does not count the {copy / 1e9:.1f} GB weight-sync copy")
    return problems


def recomputed_trainer_gb(config: dict[str, Any], tp: int, dp: int, offload: bool) -> float:
    """The trainer GPU's estimate from the recorded facts, written apart from polarstack.train.memory."""
    f = model_facts([str(a) for a in config["model"]["args"]])
    p, v, h, layers, ffn = f["parameters"], f["vocab_size"], f["hidden_size"], f["num_layers"], f["ffn_hidden_size"]
    kv = f["num_query_groups"] * h // f["num_attention_heads"]
    t = config["grpo"]["max_tokens_per_gpu"]
    static = (2 + 4 + (0 if offload else 12 / dp)) * p / tp  # bf16 + fp32 grads + distributed optimizer
    logits = 2 * t * v * 4 / tp  # fp32 logits + the softmax saved for backward (gradient in place)
    checkpoints = layers * t * h * 2 / tp  # sequence parallel splits them whenever TP > 1 (TP 1: / 1)
    layer = 2 * t * (4 * h + 2 * kv + 3 * ffn) * 2 / tp
    mem = config["memory"]
    computed = (static + logits + checkpoints + layer) / 1e9
    return (
        computed * (1 + mem["fragmentation_share"])
        + mem["cuda_context_gb"]
        + nccl_bytes(data=None) * mem["nccl_communicators"] / 1e9
    )


def _define(data: dict[str, Any], name: str) -> str:
    return data["nccl"]["facts"][name]["found"][0]["text"].split(None, 2)[2].split("/*")[0].strip()


def nccl_bytes(data: dict[str, Any] | None = None) -> float:
    """One communicator's buffers on a rank, from the recorded #define lines (not from the record's own sums):
    MAXCHANNELS x 2 ring connections x (Simple 1 << 22 + LL lines x threads x steps x 16 B + LL128 elements x threads x
    steps x 8 B), the expressions DEFAULT_BUFFSIZE, DEFAULT_LL_BUFFSIZE and DEFAULT_LL128_BUFFSIZE spell out."""
    data = data or memory.record()
    value = {k: int(_define(data, k)) for k in data["nccl"]["facts"] if _define(data, k).isdigit()}
    shift = re.fullmatch(r"\(\s*1\s*<<\s*(\d+)\s*\)", _define(data, "DEFAULT_BUFFSIZE"))  # "(1 << 22)"
    simple = 1 << int(shift.group(1)) if shift else 0
    ll = value["NCCL_LL_LINES_PER_THREAD"] * value["NCCL_LL_MAX_NTHREADS"] * value["NCCL_STEPS"] * 16
    ll128 = value["NCCL_LL128_ELEMS_PER_THREAD"] * value["NCCL_LL128_MAX_NTHREADS"] * value["NCCL_STEPS"] * 8
    return value["MAXCHANNELS"] * 2 * (simple + ll + ll128)


NCCL_EXPRESSIONS = {  # the define -> what its recorded text must say for nccl_bytes to hold
    "DEFAULT_BUFFSIZE": "(1 << 22)",
    "DEFAULT_LL_BUFFSIZE": "(NCCL_LL_LINES_PER_THREAD*NCCL_LL_MAX_NTHREADS*NCCL_STEPS*sizeof(union ncclLLFifoLine))",
    "DEFAULT_LL128_BUFFSIZE": "(NCCL_LL128_ELEMS_PER_THREAD*NCCL_LL128_MAX_NTHREADS*NCCL_STEPS*sizeof(uint64_t))",
}


def nccl_problems(data: dict[str, Any] | None = None) -> list[str]:
    data = data or memory.record()
    problems = []
    nccl = data.get("nccl") or {}
    for name, expression in NCCL_EXPRESSIONS.items():
        try:
            text = _define(data, name)
        except (KeyError, IndexError):
            problems.append(f"{memory.RECORD} nccl: {name} is not recorded; rerun scripts/tools/record_memory_facts.py")
            continue
        if text != expression:
            problems.append(f"{memory.RECORD} nccl {name} is {text!r}, not {expression!r}: the NCCL allowance is off")
    if problems:
        return problems
    recorded = int(nccl["max_channels"]) * 2 * int(nccl["bytes_per_connection"]["total"])
    if nccl_bytes(data) != recorded:
        problems.append(
            f"{memory.RECORD} nccl: the #define lines give {nccl_bytes(data):,} B per communicator, the record's sums "
            f"{recorded:,} B"
        )
    measured = (data.get("cuda_context") or {}).get("measured_mb")
    if not isinstance(measured, (int, float)) or load_defaults()["memory"]["cuda_context_gb"] * 1000 < measured:
        problems.append(
            f"memory.cuda_context_gb is below the CUDA context measured in {memory.RECORD} cuda_context ({measured} MB)"
        )
    return problems


def check(cluster: Cluster) -> Check:
    """The memory model against the recorded upstream lines, on every working profile's plan on `cluster` (the
    site's)."""
    problems = fact_problems() + nccl_problems()
    detail = []
    for name in profiles.available():
        try:
            profile = profiles.load(name)
        except StackError:  # a profile that cannot load is reported by its own checks (offline.verify)
            continue
        if profile.expect != "pass":
            continue
        capacity = memory.Capacity(memory.DEFAULT_GPU_MEMORY_GB, None, "GPU_MEMORY_GB default")
        try:
            config = load_defaults()
            plan = build_plan("humaneval", profile, run_id="verify", config=config, capacity=capacity, cluster=cluster)
        except StackError as exc:  # a plan refused for memory is this check's finding
            problems.append(f"profile {name} on 140 GB cards: {exc.message}")
            continue
        problems += weight_sync_problems(name, plan, load_defaults())
        mem = plan.memory
        again = recomputed_trainer_gb(load_defaults(), mem.tensor_parallel, mem.data_parallel, mem.offload)
        if abs(again - mem.trainer_gb) > 0.01:
            problems.append(
                f"profile {name}: the plan prints {mem.trainer_gb:.2f} GB per trainer GPU, the recorded facts give "
                f"{again:.2f} GB"
            )
        offload_args = [a for a in plan.train_args if a in memory.OFFLOAD_ARGS]
        if offload_args and offload_args != memory.OFFLOAD_ARGS or bool(offload_args) != mem.offload:
            problems.append(f"profile {name}: offload flags {offload_args} do not match the estimate's choice")
        detail.append(
            f"{name}: {mem.trainer_gb:.1f} GB per trainer GPU (offload {'on' if mem.offload else 'off'}), "
            f"host {mem.host_gb:.1f} GB"
        )
    detail.append(f"one save {retention.save_gb(load_defaults()):.1f} GB (14 B x parameters)")
    return Check(
        f"memory per GPU and host from recorded upstream facts ({memory.RECORD})",
        not problems,
        "; ".join(detail),
        problems,
    )


__all__ = ["check", "fact_problems", "nccl_bytes", "nccl_problems", "recomputed_trainer_gb"]
