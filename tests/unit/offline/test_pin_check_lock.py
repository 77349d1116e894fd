"""Pins the lock around `make verify-offline`'s `pip download` (issue 34 point 1): two processes downloading the same
wheel into the one pin-check folder at once once let one read the smg wheel the other was still writing
(FileNotFoundError in test_verify_offline.py on an empty cache). The same requirement downloads one at a time;
different requirements still run side by side (check_pins runs them all at once)."""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from polarstack.offline import verify

pytestmark = pytest.mark.unit


def _fake_pip(monkeypatch, tmp_path):
    """subprocess.run of `pip download` replaced: counts how many run at once per requirement, writes the wheel."""
    monkeypatch.setenv("POLARSTACK_CACHE", str(tmp_path))
    guard = threading.Lock()
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    overall = {"now": 0, "most": 0}

    def run(cmd, **kwargs):
        requirement, folder = cmd[-1], cmd[cmd.index("-d") + 1]
        with guard:
            now[requirement] = now.get(requirement, 0) + 1
            most[requirement] = max(most.get(requirement, 0), now[requirement])
            overall["now"] += 1
            overall["most"] = max(overall["most"], overall["now"])
        time.sleep(0.3)  # a download in flight
        (tmp_path / "pin-check").joinpath(requirement.replace("==", "-") + ".whl").write_text(folder)
        with guard:
            now[requirement] -= 1
            overall["now"] -= 1
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(verify.subprocess, "run", run)
    return most, overall


def test_one_requirement_downloads_one_at_a_time_into_the_one_folder(monkeypatch, tmp_path):
    most, _ = _fake_pip(monkeypatch, tmp_path)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: verify.check_pin("smg==1.13.0", "3.12"), range(4)))
    assert results == [(True, "")] * 4
    assert most == {"smg==1.13.0": 1}
    assert (tmp_path / "pin-check" / "smg-1.13.0.whl").read_text() == str(tmp_path / "pin-check")


def test_different_requirements_still_download_side_by_side(monkeypatch, tmp_path):
    _, overall = _fake_pip(monkeypatch, tmp_path)
    wanted = ["smg==1.13.0", "sglang-router==0.1.4", "ray==2.57.1"]
    with ThreadPoolExecutor(3) as pool:
        assert all(ok for ok, _ in pool.map(lambda r: verify.check_pin(r, "3.12"), wanted))
    assert overall["most"] > 1
