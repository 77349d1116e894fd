"""Where things are on disk: the repository root, the run dir, the download cache and the files the stack reads,
and `make train`'s settings read from configs/train/defaults.yaml with their --set overrides.

Every other module asks here (pins.repo_root and local.run_dir are aliases kept for old imports).
Imports only polarstack.errors, so any module may use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError

TRAINER_RUN_DIR = "/run-polarstack/train"  # the host's .run/train, mounted into the trainer (compose.yaml)


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


# What the tools the stack runs write into HOME unless told otherwise (issue 34: a fresh HOME after the suite held
# ~/.npm and an empty ~/.rustup): pip runs `rustc --version` for its user agent, and on a machine whose rustc is a
# rustup proxy that creates ~/.rustup; `npm view` writes its cache and logs to ~/.npm. Each goes under the
# project's cache instead, unless the environment names a place or the user's own folder is already there (a rustup
# or cargo home with toolchains is the user's; moving it would hide them). The real sglang on the CPU imports
# flashinfer, which keeps its JIT cache in $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer, HOME by default
# (flashinfer/jit/env.py of the pinned sglang's flashinfer-python 0.6.12; ~/.cache/flashinfer appeared during a run).
TOOL_HOMES = (
    ("RUSTUP_HOME", ".rustup", "rustup"),
    ("CARGO_HOME", ".cargo", "cargo"),
    ("npm_config_cache", None, "npm"),
    ("PIP_CACHE_DIR", None, "pip"),
    ("FLASHINFER_WORKSPACE_BASE", None, "flashinfer"),
    ("TILELANG_CACHE_DIR", None, "tilelang"),  # tilelang/env.py: ~/.tilelang/cache by default (~/.tilelang appeared)
    ("DOCKER_CONFIG", ".docker", "docker-config"),  # the docker CLI's buildx state (~/.docker/buildx appeared)
)


def tool_homes() -> dict[str, str]:
    """The environment that keeps pip, npm and rustup's proxies out of HOME: {variable: folder under cache_dir()} for
    each one neither set in the environment nor already a folder of the user's (see TOOL_HOMES)."""
    out = {}
    for variable, own, folder in TOOL_HOMES:
        if os.environ.get(variable) or (own and (Path.home() / own).exists()):
            continue
        out[variable] = str(cache_dir() / folder)
    return out


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
    """The host's .run/train (mounted into the trainer at TRAINER_RUN_DIR): one folder per run."""
    return run_dir() / "train"


def load_yaml(text: str) -> Any:
    """yaml.safe_load with libyaml's parser when PyYAML was built with it (the same safe loader's documents, measured
    25 times faster on configs/train/defaults.yaml: `make verify-offline` reads it dozens of times)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_defaults(overrides: list[str] | None = None, path: Path | None = None) -> dict[str, Any]:
    path = path or train_defaults()
    try:
        config = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(f"cannot read {path} ({exc}); restore it from git.", ExitCode.USAGE) from None
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise StackError(f"--set {item!r} must look like section.key=value.", ExitCode.USAGE)
        node = config
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise StackError(f"--set {key}: configs/train/defaults.yaml has no section {part!r}.", ExitCode.USAGE)
            node = node[part]
        if parts[-1] not in node:
            raise StackError(
                f"--set {key}: configs/train/defaults.yaml has no key {parts[-1]!r} there.", ExitCode.USAGE
            )
        node[parts[-1]] = yaml.safe_load(raw)
    return config
