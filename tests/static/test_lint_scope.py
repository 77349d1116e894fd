"""ruff covers every Python file of the repository (issue 35 point 5): the paths `make lint` hands to `ruff check`
and `ruff format --check` take in every tracked `*.py`, not only the package and the tests (the trainer image's
install script was outside them, and unformatted)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


def lint_paths(command: str) -> list[str]:
    """The paths after `ruff <command>` in the Makefile's lint recipe."""
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no lint target"
    for line in recipe.group(1).splitlines():
        words = shlex.split(line.strip().lstrip("@"))
        if words and words[0].endswith("/ruff") and words[1 : 1 + len(command.split())] == command.split():
            return [w for w in words[1 + len(command.split()) :] if not w.startswith("-")]
    pytest.fail(f"make lint does not run `ruff {command}`")


def tracked_python() -> set[str]:
    done = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout (git ls-files: {done.stderr.strip()})")
    return set(done.stdout.split())


def seen_by_ruff(paths: list[str]) -> set[str]:
    done = subprocess.run(
        [str(RUFF), "check", "--show-files", *paths], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return {str(Path(line).resolve().relative_to(ROOT)) for line in done.stdout.split() if line.endswith(".py")}


@pytest.mark.parametrize("command", ["check", "format --check"])
def test_make_lint_hands_ruff_every_tracked_python_file(command):
    tracked = tracked_python()
    assert tracked, "git ls-files found no Python file"
    missed = sorted(tracked - seen_by_ruff(lint_paths(command)))
    assert not missed, f"`ruff {command}` in make lint skips {missed}"
