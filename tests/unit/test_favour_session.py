"""processes.favour_session: a session's CPU share where the kernel's autogroup applies (ray_head.start's
session_nice for the harness's heads), and nothing changed where it does not or may not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from polarstack.processes import favour_session, stop_pid

ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def _autogroup(pid: int) -> str:
    return Path(f"/proc/{pid}/autogroup").read_text().strip()


def test_a_session_of_its_own_gets_the_nice_asked():
    if not ENABLED.is_file() or ENABLED.read_text().strip() != "1":
        pytest.skip("no kernel autogroup here (/proc/sys/kernel/sched_autogroup_enabled is not 1)")
    if os.geteuid() != 0:
        pytest.skip("raising a session's priority needs root (CAP_SYS_NICE)")
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        before = _autogroup(child.pid)
        assert before.endswith("nice 0"), before
        assert favour_session(child.pid, -10) is True
        after = _autogroup(child.pid)
        assert after.endswith("nice -10") and after.split()[0] == before.split()[0], (before, after)
        assert not _autogroup(os.getpid()).endswith("nice -10")  # this session's own share is untouched
    finally:
        stop_pid(child.pid, child)


def test_a_process_that_is_gone_changes_nothing_and_says_so():
    child = subprocess.Popen(["true"])
    child.wait()
    assert favour_session(child.pid, -10) is False
