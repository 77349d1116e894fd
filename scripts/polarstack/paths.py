"""Where things are on disk: the repository root, the run dir, the download cache and the files the stack reads.

Every other module asks here (pins.repo_root, local.run_dir and cache.cache_dir are aliases kept for old imports).
Imports nothing of polarstack, so any module may use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The repository root (the folder holding configs/); overridable with POLARSTACK_ROOT."""
    env = os.environ.get("POLARSTACK_ROOT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2]


def run_dir() -> Path:
    """The ignored directory of run state, rendered files and logs: POLARSTACK_RUN_DIR, else <repo>/.run."""
    env = os.environ.get("POLARSTACK_RUN_DIR")
    return Path(env) if env else repo_root() / ".run"


def cache_dir() -> Path:
    """POLARSTACK_CACHE, else $XDG_CACHE_HOME/polarstack, else ~/.cache/polarstack (created when missing)."""
    env = os.environ.get("POLARSTACK_CACHE")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "polarstack"
    base.mkdir(parents=True, exist_ok=True)
    return base


def configs_dir() -> Path:
    return repo_root() / "configs"


def profiles_dir() -> Path:
    """configs/profiles/: one <name>.env per profile."""
    return configs_dir() / "profiles"


def stack_env() -> Path:
    """configs/stack.env: the stack's knobs (both runtimes)."""
    return configs_dir() / "stack.env"


def pins_env() -> Path:
    """configs/pins.env: every external version, pinned once."""
    return configs_dir() / "pins.env"


def compose_file() -> Path:
    """compose/compose.yaml: the docker runtime's services."""
    return repo_root() / "compose" / "compose.yaml"


def train_defaults() -> Path:
    """configs/train/defaults.yaml: `make train`'s settings, overridden with --set."""
    return configs_dir() / "train" / "defaults.yaml"


def train_run_dir() -> Path:
    """The host's .run/train (mounted into the trainer at train.TRAINER_RUN_DIR): one folder per run."""
    return run_dir() / "train"
