"""Where polarstack keeps what it downloads (sglang wheel files, router virtual environments)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """POLARSTACK_CACHE, else $XDG_CACHE_HOME/polarstack, else ~/.cache/polarstack."""
    env = os.environ.get("POLARSTACK_CACHE")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "polarstack"
    base.mkdir(parents=True, exist_ok=True)
    return base
