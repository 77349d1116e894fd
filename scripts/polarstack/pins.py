"""Read configs/pins.env, the one file where every external version is pinned."""

from __future__ import annotations

import functools
from pathlib import Path

from polarstack import paths
from polarstack.errors import ExitCode, StackError

repo_root = paths.repo_root  # kept for old imports (tests, tools); the rule lives in polarstack.paths


def parse_env_file(path: Path) -> dict[str, str]:
    """Parse a KEY=value file: comments with `#`, no expansion, no quotes processing beyond strip."""
    values: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise StackError(f"{path} does not exist; restore it from git.", ExitCode.USAGE) from None
    except UnicodeDecodeError as exc:
        raise StackError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8.", ExitCode.USAGE) from None
    except OSError as exc:
        raise StackError(f"{path} cannot be read ({exc.strerror}).", ExitCode.USAGE) from None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.replace("_", "").isalnum() or not key[0].isalpha():
            raise StackError(f"{path}:{number}: expected KEY=value, got {raw!r}.", ExitCode.USAGE)
        if key in values:
            raise StackError(f"{path}:{number}: {key} is set twice.", ExitCode.USAGE)
        values[key] = value.strip().strip('"').strip("'")
    return values


@functools.cache
def pins() -> dict[str, str]:
    return parse_env_file(paths.pins_env())


def pin(key: str) -> str:
    values = pins()
    if key not in values:
        raise StackError(f"configs/pins.env has no {key}; add it there.", ExitCode.USAGE)
    return values[key]
