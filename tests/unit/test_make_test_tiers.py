"""Pins `make test`'s order and exit (issue 34 points 1 and 3), with the Makefile itself and a fake Python:
- `make test-deps` (tests/tier_deps.py) runs before either pytest, so nothing installs under a test's timeout;
- both tiers always run: the real-engine tier also when the first failed (a newcomer used to learn nothing of it);
- `make test` exits non-zero when either tier failed, and names which; pytest's 5 (nothing selected) is no failure;
- `.ci/run` installs the tiers' dependencies (`make test-deps`) before it runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

# The fake venv's python: logs its arguments; pytest's exit per tier comes from the environment.
FAKE = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$*" in
  tests/tier_deps.py*) exit "${DEPS_EXIT:-0}" ;;
  *"-m pytest"*"not sglang"*) exit "${FIRST_EXIT:-0}" ;;
  *"-m pytest"*"-m sglang"*) exit "${SECOND_EXIT:-0}" ;;
esac
exit 0
"""


def _make(tmp_path: Path, target: str = "test", **exits: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    if shutil.which("make") is None:
        pytest.skip("GNU make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE)
    (venv / "bin" / "python").chmod(0o755)
    marker = venv / ".installed"  # `_venv` is up to date: newer than pyproject.toml
    marker.touch()
    newer = (ROOT / "pyproject.toml").stat().st_mtime + 1
    os.utime(marker, (newer, newer))
    log = tmp_path / "calls.log"
    env = {**os.environ, "FAKE_LOG": str(log), **exits}
    env.pop("MAKEFLAGS", None)
    proc = subprocess.run(
        ["make", "-C", str(ROOT), target, f"VENV={venv}"], capture_output=True, text=True, env=env, timeout=60
    )
    return proc, log.read_text().splitlines() if log.exists() else []


def _tiers(calls: list[str]) -> list[str]:
    out = []
    for call in calls:
        if call.startswith("tests/tier_deps.py"):
            out.append("deps " + call.split(" ", 1)[1])
        elif "-m pytest" in call:
            out.append("real-engine" if "-m sglang" in call else "first")
    return out


def test_a_failing_first_tier_still_runs_the_real_engine_tier_and_make_test_fails(tmp_path):
    proc, calls = _make(tmp_path, FIRST_EXIT="1")
    assert _tiers(calls) == ["deps test", "first", "real-engine"], calls
    assert proc.returncode != 0
    assert "FAILED: tiers without the real engine (exit 1)" in proc.stderr, proc.stderr
    assert "the real-engine tier (sglang) took" in proc.stderr


def test_a_failing_real_engine_tier_fails_make_test(tmp_path):
    proc, calls = _make(tmp_path, SECOND_EXIT="1")
    assert _tiers(calls) == ["deps test", "first", "real-engine"], calls
    assert proc.returncode != 0 and "FAILED: the real-engine tier (exit 1)" in proc.stderr, proc.stderr


def test_both_failing_name_both(tmp_path):
    proc, _ = _make(tmp_path, FIRST_EXIT="1", SECOND_EXIT="2")
    assert proc.returncode != 0
    assert "FAILED: tiers without the real engine (exit 1) and the real-engine tier (exit 2)" in proc.stderr


@pytest.mark.parametrize("second", ["0", "5"])
def test_passing_tiers_pass(tmp_path, second):
    proc, calls = _make(tmp_path, SECOND_EXIT=second)
    assert proc.returncode == 0, proc.stderr
    assert _tiers(calls) == ["deps test", "first", "real-engine"] and "FAILED" not in proc.stderr


def test_a_failed_install_runs_no_tier(tmp_path):
    """test-deps failing (PyPI unreachable) stops `make test` before pytest: its sentence is the one to read."""
    proc, calls = _make(tmp_path, DEPS_EXIT="6")
    assert proc.returncode != 0 and _tiers(calls) == ["deps test"], calls


def test_the_cluster_tier_installs_its_own_first(tmp_path):
    _proc, calls = _make(tmp_path, "test-cluster")
    assert _tiers(calls)[:1] == ["deps cluster"] and any("-m cluster" in c for c in calls), calls


def test_ci_installs_the_tiers_dependencies_before_it_tests():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if not ln.strip().startswith("#")]
    deps = next(i for i, ln in enumerate(lines) if ln.startswith("make test-deps"))
    assert "cluster" in lines[deps] and "test" in lines[deps].split("TEST_TIERS=", 1)[1]
    assert deps < next(i for i, ln in enumerate(lines) if "make test" in ln and "test-deps" not in ln)
