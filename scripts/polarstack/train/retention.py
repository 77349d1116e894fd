"""Checkpoint retention (issue 26 point 5): keep the last `checkpoint.keep_last` saves, and refuse a plan whose saves
cannot fit the checkpoints volume.

slime's save_model (slime/backends/megatron_utils/actor.py, configs/upstream/memory-facts.json save_model) saves the
model and the optimizer at every save and deletes none; slime has no retention option (no_retention_option). One
save holds bf16 weights + fp32 master weights + exp_avg + exp_avg_sq = 14 B per parameter (computed from the model's
arguments, not measured). launch.sh runs `python3 -m polarstack.train.retention` beside the job: after each
successful save (Megatron writes latest_checkpointed_iteration.txt once the save is complete) it removes the iter_*
directories older than the newest `keep_last`, never the one the job resumed from and never one newer than the
tracker (a save being written). keep_last 0 keeps every save, as slime does.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.train import memory
from polarstack.train.model_size import model_facts

TRACKER = "latest_checkpointed_iteration.txt"
ITER = re.compile(r"^iter_(\d{7})$")
WATCH_SECONDS = 60


def save_gb(config: dict[str, Any]) -> float:
    """One save of the actor: bf16 weights + fp32 master + exp_avg + exp_avg_sq (decimal GB, computed)."""
    return memory.CHECKPOINT_BYTES * model_facts([str(a) for a in config["model"]["args"]])["parameters"] / memory.GB


def weight_sync_gb(config: dict[str, Any]) -> float:
    """One weight sync over disk: slime writes a full HF copy of the weights (bf16, 2 B x parameters) under
    --update-weight-disk-dir and removes it only once the engines reloaded it (memory-facts.json
    weight_sync_full_hf_copy, weight_sync_copy_removed); decimal GB, computed."""
    return memory.BF16 * model_facts([str(a) for a in config["model"]["args"]])["parameters"] / memory.GB


def saves_in_plan(num_rollout: int, interval: int) -> int:
    """How many saves slime makes: after rollout r when (r + 1) % interval == 0, and after the last rollout
    (slime/utils/misc.py should_run_periodic_action, train_async.py; configs/train/defaults.yaml `checkpoint:`)."""
    periodic = num_rollout // interval
    return periodic + (0 if num_rollout % interval == 0 else 1)


def keep_last(config: dict[str, Any]) -> int:
    value = (config.get("checkpoint") or {}).get("keep_last")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StackError(
            f"checkpoint.keep_last={value!r} must be a non-negative integer (0 keeps every save).", ExitCode.USAGE
        )
    return value


def peak_saves(config: dict[str, Any]) -> int:
    """Saves on the volume at most: keep_last plus the one being written; every save of the plan with keep_last 0."""
    total = saves_in_plan(int(config["grpo"]["num_rollout"]), int(config["checkpoint"]["save_interval"]))
    keep = keep_last(config)
    return total if keep == 0 else min(total, keep + 1)


def sentence(config: dict[str, Any]) -> str:
    size, keep = save_gb(config), keep_last(config)
    total = saves_in_plan(int(config["grpo"]["num_rollout"]), int(config["checkpoint"]["save_interval"]))
    return (
        f"checkpoint retention: one save {size:.1f} GB (14 B x parameters, computed); at least {total} saves in the "
        f"plan, one more at each epoch end ({total * size:,.0f} GB or more if all were kept); "
        + (
            f"keep_last {keep}: at most {peak_saves(config)} on the volume ({peak_saves(config) * size:,.1f} GB)"
            if keep
            else "keep_last 0 keeps them all"
        )
    )


def disk_problem(config: dict[str, Any], free_bytes: int, resume: bool, *, weight_sync_on_disk: bool) -> str | None:
    """None when the plan's saves (and, with the disk transport, one weight-sync copy: both volumes live on Docker's
    disk) fit the free space; else one sentence naming the numbers. A resumed run's saves already on the volume stay
    until pruned, so it needs room for the next one at least."""
    size = save_gb(config)
    saves = size if resume else peak_saves(config) * size
    sync = weight_sync_gb(config) if weight_sync_on_disk else 0.0
    needed = saves + sync
    free = free_bytes / memory.GB
    if free >= needed:
        return None
    what = "the next save" if resume else f"{peak_saves(config)} saves"
    return (
        f"the checkpoints volume has {free:,.1f} GB free and this run needs {needed:,.1f} GB "
        f"({what} of {size:.1f} GB each"
        + (f", plus one weight-sync copy of {sync:.1f} GB (2 B x parameters)" if sync else "")
        + ", computed); free space, or lower checkpoint.keep_last"
    )


DF_AVAIL = ["df", "-B1", "--output=avail"]  # + the directory: free bytes of its filesystem, on the last line


def parse_df(stdout: str) -> int | None:
    """Free bytes from `df -B1 --output=avail DIR`; None when unreadable."""
    last = (stdout or "").strip().splitlines()[-1:]
    return int(last[0]) if last and last[0].strip().isdigit() else None


def logs_probe(checkpoints: str, logs: str) -> str:
    """A shell command for the trainer: the device number of each directory's filesystem (`stat -c %d`, one a line;
    two Docker volumes in one filesystem share it), then `df`'s free bytes of the logs' filesystem on the last line."""
    return f"stat -c %d {shlex.quote(checkpoints)} {shlex.quote(logs)} && {shlex.join([*DF_AVAIL, logs])}"


def parse_logs_probe(stdout: str) -> tuple[bool, int] | None:
    """(the logs share the checkpoints' filesystem, the logs' filesystem's free bytes) from logs_probe's output; None
    when unreadable."""
    lines = [line.strip() for line in (stdout or "").strip().splitlines()]
    free = parse_df(stdout)
    if len(lines) < 4 or not (lines[0].isdigit() and lines[1].isdigit()) or free is None:
        return None
    return lines[0] == lines[1], free


def logs_sentence(probe: tuple[bool, int] | None, results_dir: str) -> str:
    """What make train says of Polar's saved results beside the checkpoints' check: they are not counted in it."""
    what = (
        f"Polar's saved results ({results_dir}: every session's result and every completion as JSON, pruned by "
        'nothing; docs/gpu-node.md, "Polar\'s saved results")'
    )
    if probe is None:
        return (
            f"{what}: the free space of their filesystem could not be read; not counted in the checkpoints' disk check"
        )
    same, free = probe
    if same:
        return f"{what} share the checkpoints' filesystem but are not counted in its disk check"
    return f"{what}: {free / 1e9:,.1f} GB free on their own filesystem, not counted in the checkpoints' disk check"


def iterations(directory: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in directory.iterdir() if p.is_dir() and (m := ITER.match(p.name)))


def prune(directory: Path, keep: int, protect: int | None = None) -> list[int]:
    """Remove iter_* older than the newest `keep` at or below the tracker; returns the iterations removed."""
    if keep <= 0:
        return []
    try:
        latest = int((directory / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return []  # no complete save yet (or a tracker being written): touch nothing
    if not (directory / f"iter_{latest:07d}").is_dir():
        return []
    done = [i for i in iterations(directory) if i <= latest]  # newer ones are being written
    kept = set(done[-keep:]) | {latest} | ({protect} if protect is not None else set())
    removed = []
    for iteration in done:
        if iteration not in kept:
            shutil.rmtree(directory / f"iter_{iteration:07d}", ignore_errors=True)
            removed.append(iteration)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="keep the newest checkpoint.keep_last saves of one run")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--keep-last", type=int, required=True)
    parser.add_argument("--protect", type=int, default=-1, help="an iteration never removed (the one resumed)")
    parser.add_argument("--watch", action="store_true", help=f"repeat every {WATCH_SECONDS} s until killed")
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    protect = args.protect if args.protect >= 0 else None
    while True:
        if directory.is_dir():
            removed = prune(directory, args.keep_last, protect)
            if removed:
                print(
                    f"polarstack retention: removed iter {', '.join(map(str, removed))} in {directory}", file=sys.stderr
                )
        if not args.watch:
            return 0
        time.sleep(WATCH_SECONDS)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["disk_problem", "peak_saves", "prune", "save_gb", "saves_in_plan", "sentence", "weight_sync_gb"]
