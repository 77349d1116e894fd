#!/usr/bin/env python3
"""Record the batch-layout rules Megatron and slime enforce at start-up (configs/upstream/batch-rules.json).

Each fact is a statement found in the pinned source, with its file and line, so `make verify-offline`
(polarstack.train.batch_layout via polarstack.offline.verify) can check every profile's launch against the rule it
states.

Usage:
  python scripts/tools/record_batch_rules.py --slime-git /work/.mirror/THUDM+slime/repo \
      --megatron-file num_microbatches_calculator.py --megatron-commit SHA > configs/upstream/batch-rules.json
--slime-git is a git directory holding SLIME_COMMIT (configs/pins.env); --megatron-file is Megatron-LM's
megatron/core/num_microbatches_calculator.py at --megatron-commit (slime's docker/Dockerfile pins the commit;
say in --megatron-note which one you could read).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (key, file, statement that must appear in it, what it means)
SLIME_FACTS = [
    (
        "microbatch_calculator_call",
        "slime/backends/megatron_utils/initialize.py",
        "init_num_microbatches_calculator(",
        "slime builds Megatron's micro-batch calculator with args.global_batch_size, args.micro_batch_size and "
        "args.data_parallel_size even with --use-dynamic-batch-size (its comment: 'initialize to pass some "
        "validation in megatron')",
    ),
    (
        "micro_batch_size_default",
        "slime/utils/arguments.py",
        'reset_arg(parser, "--micro-batch-size", type=int, default=1)',
        "slime's --micro-batch-size defaults to 1",
    ),
    (
        "num_steps_per_rollout_rule",
        "slime/utils/arguments.py",
        "global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout",
        "with --num-steps-per-rollout set, slime asserts global_batch_size equals this",
    ),
    (
        "steps_per_rollout",
        "slime/utils/dp_schedule.py",
        "num_steps = len(rollout_ids) // global_batch_size",
        "a rollout trains len(rollout_ids) // global_batch_size steps (trailing rollouts dropped); "
        "global_batch_size counts rollouts (trajectories), not trace samples",
    ),
    (
        "at_least_one_step",
        "slime/utils/dp_schedule.py",
        "assert num_steps >= 1",
        "a rollout with fewer trajectories than global_batch_size is an assertion error",
    ),
]
MEGATRON_STATEMENT = "assert global_batch_size % micro_batch_times_data_parallel_size == 0"


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def find(text: str, statement: str, where: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if statement in line:
            return number
    sys.exit(f"{where} does not contain {statement!r}: the rule changed; read the source again.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slime-git", required=True)
    parser.add_argument("--megatron-file", required=True)
    parser.add_argument("--megatron-commit", required=True)
    parser.add_argument("--megatron-note", default="")
    opts = parser.parse_args()
    commit = pins()["SLIME_COMMIT"]
    slime = {}
    for key, path, statement, meaning in SLIME_FACTS:
        text = subprocess.run(
            ["git", "-C", opts.slime_git, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout
        slime[key] = {"file": path, "line": find(text, statement, path), "statement": statement, "meaning": meaning}
    slime["micro_batch_size_default"]["value"] = 1
    megatron_text = Path(opts.megatron_file).read_text()
    record = {
        "what": "Batch-layout rules Megatron-LM and slime enforce when train_async.py starts (checked by "
        "polarstack.train.batch_layout in `make train` and `make verify-offline`).",
        "slime_commit": commit,
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_batch_rules.py",
        "slime": slime,
        "megatron": {
            "file": "megatron/core/num_microbatches_calculator.py",
            "commit_read": opts.megatron_commit,
            "note": opts.megatron_note,
            "constant_calculator": {
                "line": find(megatron_text, MEGATRON_STATEMENT, opts.megatron_file),
                "statement": MEGATRON_STATEMENT,
                "meaning": "ConstantNumMicroBatchesCalculator (no --rampup-batch-size, decrease_batch_size_if_needed "
                "False) asserts global_batch_size % (micro_batch_size x data_parallel_size) == 0",
            },
        },
        "data_parallel_size": "actor GPUs / (tensor x pipeline x context parallel size)",
    }
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
