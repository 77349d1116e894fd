"""tests/favoured_sessions.py, the cluster tier's favour for the sessions `polarstack up` starts on each node: a new
session of a descendant is found and favoured, this process's own session and a stranger's are not."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from favoured_sessions import favoured_new_sessions, new_sessions
from polarstack.processes import stop_pid

ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def test_a_descendant_s_new_session_is_found_and_this_session_is_not():
    child = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    same = subprocess.Popen(["sleep", "60"])  # this process's own session
    try:
        time.sleep(0.3)
        found = new_sessions(os.getpid(), {os.getsid(0)})
        assert child.pid in found and os.getsid(child.pid) == child.pid, found
        assert os.getsid(0) not in found and os.getsid(same.pid) not in found
        assert child.pid not in new_sessions(os.getpid(), {os.getsid(0), child.pid})  # known: skipped
    finally:
        stop_pid(child.pid, child)
        stop_pid(same.pid, same)


def test_the_sessions_a_command_starts_are_favoured_while_it_runs():
    if not ENABLED.is_file() or ENABLED.read_text().strip() != "1":
        pytest.skip("no kernel autogroup here (/proc/sys/kernel/sched_autogroup_enabled is not 1)")
    if os.geteuid() != 0:
        pytest.skip("raising a session's priority needs root (CAP_SYS_NICE)")
    with favoured_new_sessions(-10) as favoured:
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while child.pid not in favoured and time.monotonic() < deadline:
                time.sleep(0.1)
            assert child.pid in favoured
            assert Path(f"/proc/{child.pid}/autogroup").read_text().strip().endswith("nice -10")
        finally:
            stop_pid(child.pid, child)
    assert not Path(f"/proc/{os.getpid()}/autogroup").read_text().strip().endswith("nice -10")
