"""Run state of the docker runtime: which profile `make up` started, so smoke/train/down default to it.

The local runtime keeps its topology in .run/state.json (polarstack.local); the docker runtime keeps
.run/docker-state.json, written after a successful `docker compose up` and removed by `make down` / `make clean`.
Without it, `make smoke` / `make train` after `make up PROFILE=patched-router` fell back to engine-direct and
asked Ray for GPUs that profile does not give the trainer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.local import run_dir

STATE_FILE = "docker-state.json"
DEFAULT_PROFILE = "engine-direct"


def state_path(directory: Path | None = None) -> Path:
    return (directory or run_dir()) / STATE_FILE


def read(directory: Path | None = None) -> dict[str, Any] | None:
    path = state_path(directory)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        raise StackError(f"{path} is unreadable; check `make ps` and remove it, or run `make down PROFILE=...`.",
                         ExitCode.STATE) from None
    if not isinstance(data, dict) or not isinstance(data.get("profile"), str):
        raise StackError(f"{path} names no profile; remove it after checking `make ps`.", ExitCode.STATE)
    return data


def write(profile, directory: Path | None = None) -> Path:
    """Record that `profile` (a polarstack.profiles.Profile) is up under Compose."""
    path = state_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"profile": profile.name, "runtime": "docker", "started_at": time.time(),
            "base_url": profile.base_url(), "route": profile.route}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def clear(directory: Path | None = None) -> bool:
    path = state_path(directory)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def profile_name(explicit: str | None, directory: Path | None = None) -> str:
    """The profile a docker-runtime command acts on: the explicit one, else the one up, else engine-direct."""
    if explicit:
        return explicit
    state = read(directory)
    return state["profile"] if state else DEFAULT_PROFILE
