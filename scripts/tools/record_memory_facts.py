#!/usr/bin/env python3
"""Record the upstream lines the memory model (polarstack.train.memory) and checkpoint retention rely on.

Run with a clone (or bare mirror) of THUDM/slime that has SLIME_COMMIT, the pinned sglang wheel
(`pip download --no-deps sglang==SGLANG_VERSION`) and a clone (or bare mirror) of NVIDIA/nccl holding NCCL_TAG:
  python scripts/tools/record_memory_facts.py /path/to/slime.git /path/to/sglang-*.whl /path/to/nccl.git \
      > configs/upstream/memory-facts.json

NCCL (issue 34 point 2): the buffer sizes of one connection per protocol (Simple, LL, LL128) and MAXCHANNELS, from
src/init.cc and src/include/device.h at NCCL_TAG (the trainer's NCCL comes with slime image's torch and is not pinned;
these constants are the same from 2.26 to 2.30), and the bytes one connection's buffers take, computed from them. The
CUDA context's size is a public measurement (CUDA_CONTEXT below), not a line of code: no GPU here to measure it.

Each fact is one line (or a few) found by a pattern in a file at the pinned revision, recorded with its line number
and text. `make verify-offline` (polarstack.offline.memory_facts) checks that each recorded line still says what the
model assumes (the distributed optimizer is forced on, the actor's logits are fp32, the softmax is kept for backward
and reused in place as the gradient, --log-probs-chunk-size chunks the training pass too, ...), and recomputes the
estimate from them.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# key: (file, pattern, lines of context after the match to keep)
SLIME_FACTS = {
    "distributed_optimizer": (
        "slime/backends/megatron_utils/arguments.py",
        r"args\.use_distributed_optimizer = True",
        0,
    ),
    "bf16": ("slime/backends/megatron_utils/arguments.py", r"args\.bf16 = not args\.fp16", 0),
    # The actor is built by Megatron's get_model (model.py), which under --bf16 wraps each model chunk in Float16Module:
    # its forward returns the last stage's outputs as fp32 (megatron/core/transformer/module.py float16_to_fp32, at
    # slime's MEGATRON_COMMIT; not recorded here). model_provider.py's `logits = logits.float()` is the critic's value
    # head (LinearForLastLayer, role == "critic"), not the actor's output layer: GRPO never builds it.
    "logits_fp32": (
        "slime/backends/megatron_utils/model.py",
        r"^from megatron\.training\.training import get_model$|model = get_model\(get_model_provider_func\(args, role\)",
        0,
    ),
    # slime's own log-prob kernel computes in fp32 whatever it is given (one chunk at a time)
    "log_prob_kernel_fp32": (
        "slime/utils/ppo_utils.py",
        r"vocab_parallel_logits = vocab_parallel_logits\.float\(\)",
        0,
    ),
    "loss_asserts_fp32": ("slime/backends/megatron_utils/loss.py", r"assert logits\.dtype == torch\.float32", 0),
    "softmax_saved_for_backward": ("slime/utils/ppo_utils.py", r"ctx\.save_for_backward\(", 1),
    "gradient_reuses_softmax": ("slime/utils/ppo_utils.py", r"grad_input = log_prob_softmax\.neg_\(\)", 0),
    "log_probs_chunk_size_default": ("slime/utils/arguments.py", r'"--log-probs-chunk-size", type=int, default=', 0),
    # --log-probs-chunk-size reaches the training pass too: policy_loss_function -> get_log_probs_and_entropy (loss.py)
    # passes it to calculate_log_probs_and_entropy (ppo_utils.py), which splits the logits into chunks and runs each
    # through _VocabParallelLogProbEntropy, whose forward saves that chunk's fp32 softmax for backward: the chunks' saved
    # softmaxes add up to the whole T x V, so chunking bounds the temporaries of one chunk, not what backward keeps.
    "log_probs_chunk_size_in_loss": (
        "slime/backends/megatron_utils/loss.py",
        r"chunk_size = args\.log_probs_chunk_size$",
        0,
    ),
    "training_pass_calls_log_probs": (
        "slime/backends/megatron_utils/loss.py",
        r"_, log_probs_and_entropy = get_log_probs_and_entropy\($",
        0,
    ),
    "log_probs_chunked": ("slime/utils/ppo_utils.py", r"logits_chunks = logits\.chunk\(num_chunks, dim=0\)", 0),
    "chunk_saves_softmax": (
        "slime/utils/ppo_utils.py",
        r"log_prob, entropy = _VocabParallelLogProbEntropy\.apply\($",
        0,
    ),
    "offload_flags": (
        "scripts/run-qwen3-30B-A3B.sh",
        r"--optimizer-cpu-offload|--overlap-cpu-optimizer-d2h-h2d|--use-precision-aware-optimizer",
        0,
    ),
    "backup_in_pinned_host_memory": (
        "slime/utils/tensor_backper.py",
        r'torch\.empty_like\(param, device=torch\.device\("cpu"\), pin_memory=True\)',
        0,
    ),
    "actor_backup": ("slime/backends/megatron_utils/actor.py", r'self\.weights_backuper\.backup\("actor"\)', 0),
    "ref_backup": (
        "slime/backends/megatron_utils/actor.py",
        r'self\.load_other_checkpoint\("ref", args\.ref_load\)',
        0,
    ),
    "save_model": (
        "slime/backends/megatron_utils/actor.py",
        r"save\(rollout_id, self\.model, self\.optimizer, self\.opt_param_scheduler\)",
        0,
    ),
    # each weight sync over disk writes a full HF copy of the weights (bf16) under --update-weight-disk-dir ...
    "weight_sync_full_hf_copy": (
        "slime/backends/megatron_utils/update_weight/update_weight_from_disk.py",
        r"save_hf_model_to_path\(",
        1,
    ),
    # ... removed only after the engines reloaded it, unless --update-weight-disk-keep-files
    "weight_sync_copy_removed": ("slime/ray/actor_group.py", r"if not self\.args\.update_weight_disk_keep_files:", 1),
}
SGLANG_FACTS = {
    "mem_fraction_static": (
        "sglang/srt/server_args.py",
        r"mem_fraction_static is defined as \(model weights \+ KV cache pool\) / GPU memory capacity",
        0,
    ),
    "kv_cell_size": (
        "sglang/srt/model_executor/pool_configurator.py",
        r"model_config\.get_num_kv_heads\(tp_size\)$",
        3,
    ),
}
# slime has no option that bounds how many checkpoints a run keeps (retention is this stack's: polarstack.train.retention)
NCCL_TAG = "v2.27.7-1"
NCCL_DEFINES = {  # name -> file; each `#define NAME VALUE` line is recorded
    "NCCL_STEPS": "src/include/device.h",
    "MAXCHANNELS": "src/include/device.h",
    "NCCL_LL_MAX_NTHREADS": "src/include/device.h",
    "NCCL_LL_LINES_PER_THREAD": "src/include/device.h",
    "NCCL_LL128_MAX_NTHREADS": "src/include/device.h",
    "NCCL_LL128_ELEMS_PER_THREAD": "src/include/device.h",
    "DEFAULT_LL_BUFFSIZE": "src/init.cc",
    "DEFAULT_LL128_BUFFSIZE": "src/init.cc",
    "DEFAULT_BUFFSIZE": "src/init.cc",
}
LL_FIFO_LINE_BYTES = 16  # union ncclLLFifoLine: data1, flag1, data2, flag2 (uint32_t each; src/include/device.h)
CUDA_CONTEXT = {
    "source": "https://github.com/pytorch/pytorch/issues/34323",
    "measured_mb": 781,
    "fact": "nvidia-smi showed 781 MB used by a PyTorch process right after its first CUDA call, before the program's "
    "own tensors: the CUDA context and the kernels loaded with it (read by a person; the size varies with the GPU, "
    "the driver and CUDA's lazy loading)",
}


def nccl_facts(repo: str) -> dict:
    bare = not (Path(repo) / ".git").exists()
    git = ["git", f"--git-dir={repo}"] if bare else ["git", "-C", repo]
    files: dict[str, str] = {}
    facts, values = {}, {}
    for name, path in NCCL_DEFINES.items():
        if path not in files:
            files[path] = subprocess.run(
                [*git, "show", f"{NCCL_TAG}:{path}"], capture_output=True, text=True, check=True
            ).stdout
        found = find(files[path], rf"^#define {name} ", 0)[:1]
        facts[name] = {"file": path, "found": found}
        value = found[0]["text"].split(None, 2)[2].split("/*")[0].strip()
        if re.fullmatch(r"\d+", value):
            values[name] = int(value)
    ll = values["NCCL_LL_LINES_PER_THREAD"] * values["NCCL_LL_MAX_NTHREADS"] * values["NCCL_STEPS"] * LL_FIFO_LINE_BYTES
    ll128 = values["NCCL_LL128_ELEMS_PER_THREAD"] * values["NCCL_LL128_MAX_NTHREADS"] * values["NCCL_STEPS"] * 8
    simple = 1 << 22  # DEFAULT_BUFFSIZE (1 << 22) /* 4MiB */
    return {
        "repo": "https://github.com/NVIDIA/nccl",
        "tag": NCCL_TAG,
        "facts": facts,
        "ll_fifo_line_bytes": LL_FIFO_LINE_BYTES,
        "bytes_per_connection": {"simple": simple, "ll": ll, "ll128": ll128, "total": simple + ll + ll128},
        "max_channels": values["MAXCHANNELS"],
    }


RETENTION_OPTION = r'"--(?:keep|max|save-total)[-a-z]*(?:ckpt|checkpoint|save|limit)[-a-z]*"'


def pin(name: str) -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"configs/pins.env has no {name}")


def enclosing(lines: list[str], number: int) -> str:
    """The name of the top-level function or class a line belongs to ("" at module level)."""
    for line in reversed(lines[: number - 1]):
        match = re.match(r"(?:async )?(?:def|class) (\w+)", line)
        if match:
            return match.group(1)
    return ""


def find(text: str, pattern: str, after: int) -> list[dict]:
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        if re.search(pattern, line.strip()):
            found.append(
                {
                    "line": number,
                    "text": "\n".join(x.strip() for x in lines[number - 1 : number + after]),
                    "in": enclosing(lines, number),
                }
            )
    if not found:
        raise SystemExit(f"pattern {pattern!r} not found")
    return found


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    repo, wheel, nccl_repo = sys.argv[1], sys.argv[2], sys.argv[3]
    commit = pin("SLIME_COMMIT")

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    slime = {key: {"file": f, "found": find(show(f), p, a)} for key, (f, p, a) in SLIME_FACTS.items()}
    grep = subprocess.run(
        [
            "git",
            "-C",
            repo,
            "grep",
            "-n",
            "-E",
            "-e",
            r"--log-probs-chunk-size [0-9]+",
            commit,
            "--",
            "scripts",
            "examples",
        ],
        capture_output=True,
        text=True,
    ).stdout
    used = []
    for row in grep.splitlines():
        _, path, line, text = row.split(":", 3)
        used.append({"file": path, "line": int(line), "value": int(text.split()[-1])})
    slime["log_probs_chunk_size_used"] = {"file": "scripts/, examples/", "found": used}
    arguments = show("slime/utils/arguments.py") + show("slime/backends/megatron_utils/arguments.py")
    slime["no_retention_option"] = {
        "file": "slime/utils/arguments.py, slime/backends/megatron_utils/arguments.py",
        "pattern": RETENTION_OPTION,
        "matches": re.findall(RETENTION_OPTION, arguments),
    }
    with zipfile.ZipFile(wheel) as archive:
        sglang = {
            key: {"file": f, "found": find(archive.read(f).decode(), p, a)} for key, (f, p, a) in SGLANG_FACTS.items()
        }
    record = {
        "what": "upstream lines the memory model and checkpoint retention rely on (record_memory_facts.py)",
        "slime_commit": commit,
        "sglang_version": pin("SGLANG_VERSION"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_memory_facts.py",
        "slime": slime,
        "sglang": sglang,
        "nccl": nccl_facts(nccl_repo),
        "cuda_context": CUDA_CONTEXT,
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
