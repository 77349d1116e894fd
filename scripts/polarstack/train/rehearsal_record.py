"""The rehearsal's pass record, and the check `make train` makes against it on the docker runtime.

A passing `make preflight` writes .run/preflight/<profile>.json with a hash of what it proved: every pin
(configs/pins.env), the profile's values (configs/profiles/<name>.env), the stack's knobs (configs/stack.env and
the environment, without the model's name and path) and the rehearsal's
plan (both jobs' train_async.py arguments and files, rendered with a fixed run id, so the plan is what
configs/train/defaults.yaml + preflight.yaml say, not when it ran). `make train` on the docker runtime
recomputes the hash and refuses (NO_REHEARSAL) without a passing record of the same hash; ALLOW_NO_PREFLIGHT=1
(`polarstack train --without-rehearsal`) overrides. Either way it prints the rehearsal's age.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.paths import run_dir
from polarstack.pins import pins
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile, stack_knobs
from polarstack.train import preflight
from polarstack.train.tracker import WANDB_KEY_ENV

HASH_RUN_ID = "rehearsal"  # the run id the hashed plan is rendered with
# configs/stack.env knobs that name the model: the rehearsal serves its own small model, so they are not hashed.
MODEL_KNOBS = ("MODEL_NAME", "MODEL_DIR", "MODEL_PATH", "SERVED_MODEL_NAME")


def record_path(profile_name: str) -> Path:
    return run_dir() / "preflight" / f"{profile_name}.json"


@contextlib.contextmanager
def _without_tracker_key():
    """The tracker (W&B with WANDB_API_KEY, else TensorBoard) is not what the rehearsal proves: hash one variant."""
    saved = os.environ.pop(WANDB_KEY_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[WANDB_KEY_ENV] = saved


def plan_hash(
    profile: Profile, *, cluster: Cluster, pin_values: dict[str, str] | None = None, sets: list[str] | None = None
) -> str:
    """The hash of what a rehearsal of `profile` on `cluster` (the caller's, the site's) proves (module docstring)."""
    with _without_tracker_key():
        plan = preflight.build(profile, run_id=HASH_RUN_ID, sets=sets, cluster=cluster)
    material = {
        "pins": dict(sorted((pin_values if pin_values is not None else pins()).items())),
        "profile": {"name": profile.name, "values": dict(sorted(profile.values.items()))},
        # the stack's knobs (engine memory, tool-call parser, weight sync, GPUs), as Compose gets them
        "stack": {k: v for k, v in sorted(stack_knobs().items()) if k not in MODEL_KNOBS},
        "plan": {
            "phases": [
                {"name": name, "train_args": p.train_args, "commands": p.as_dict()["commands"]}
                for name, p in plan.phases
            ],
            "files": dict(sorted(plan.files.items())),
        },
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def write(
    profile: Profile,
    result: dict[str, Any],
    report_path: str,
    *,
    cluster: Cluster,
    now: float | None = None,
    sets: list[str] | None = None,
) -> Path:
    """The record of one rehearsal on `cluster` (the plan's); with SET overrides its hash is that plan's, which
    `make train` does not match."""
    path = record_path(profile.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "profile": profile.name,
        "hash": plan_hash(profile, cluster=cluster, sets=sets),
        "passed": bool(result["passed"]),
        "finished_at": now if now is not None else time.time(),
        "report": report_path,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def require(profile: Profile, *, cluster: Cluster, override: bool, now: float | None = None) -> str:
    """The sentence `make train` prints about the rehearsal; NO_REHEARSAL unless one passed for this hash (of the plan
    on `cluster`, the run's)."""
    now = now if now is not None else time.time()
    path = record_path(profile.name)
    record: dict[str, Any] | None = None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        record = None
    problem = None
    if record is None:
        problem = f"no rehearsal of profile {profile.name} was recorded ({path})"
    elif not record.get("passed"):
        problem = f"the last rehearsal of profile {profile.name} failed ({record.get('report')})"
    elif record.get("hash") != plan_hash(profile, cluster=cluster):
        problem = (
            f"the rehearsal of profile {profile.name} ({age(now - float(record['finished_at']))} ago) proved other "
            "pins, profile values or plan than this run's"
        )
    if problem is None:
        return (
            f"polarstack: the rehearsal of profile {profile.name} passed {age(now - float(record['finished_at']))} "
            f"ago with these pins and this plan ({record.get('report')})."
        )
    if override:
        return f"polarstack: WARNING {problem}; launching anyway (ALLOW_NO_PREFLIGHT=1)."
    raise StackError(
        f"refusing to launch: {problem}; run `make preflight PROFILE={profile.name}` first (docs/preflight.md), or "
        "set ALLOW_NO_PREFLIGHT=1 to launch without one.",
        ExitCode.NO_REHEARSAL,
    )


__all__ = ["plan_hash", "write", "require", "record_path", "age"]
