"""Where polarstack keeps what it downloads (sglang wheel files, router virtual environments).

The rule lives in polarstack.paths; `cache_dir` stays importable from here.
"""

from __future__ import annotations

from polarstack.paths import cache_dir

__all__ = ["cache_dir"]
