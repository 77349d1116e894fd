"""Pins issue 34 point 4: the tests that signal a child pass when pytest itself inherited SIGHUP, SIGINT and SIGTERM
as ignored (`nohup` ignores SIGHUP, a non-interactive shell's background job SIGINT, some launchers SIGTERM). Before,
test_job_control's trap test timed out under `nohup` (bash cannot trap a signal ignored on entry) and the SIGTERM
tests failed under an ignoring launcher. The unit tests among them run here in a child pytest started with all three
ignored; tests/integration/test_run_state.py's `up` and `demo` children use the same tests/default_signals.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from default_signals import SIGNALS, default_signals, defaults_here

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
SIGNALLING = [
    "tests/unit/train/test_job_control.py::test_the_trap_stops_this_attempts_job_on_a_signal",
    "tests/unit/train/test_job_control.py::test_servers_left_by_an_earlier_attempt_are_stopped_by_their_pids",
    "tests/unit/train/test_job_control.py::test_an_interrupted_make_train_stops_the_attempts_job",
    "tests/unit/test_processes.py::test_sigterm_runs_the_cleanup_only_when_turned_into_an_interrupt",
]


def _ignore_all() -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def test_the_signalling_tests_pass_with_the_signals_ignored_on_entry():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "--timeout", "120"]
        + SIGNALLING,
        capture_output=True,
        text=True,
        cwd=ROOT,
        preexec_fn=_ignore_all,
        timeout=280,
    )
    tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
    assert proc.returncode == 0, tail
    assert proc.stdout.strip().splitlines()[-1].startswith("8 passed"), (
        tail
    )  # 3 signals, 1, 2 interruptions, 2 modes: every one ran


def test_default_signals_resets_an_inherited_ignore_in_the_child():
    probe = (
        "import signal\n"
        "for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):\n"
        "    h = signal.getsignal(s)\n"
        "    print(int(h) if isinstance(h, int) else 'python')\n"
    )

    def ignore_then_default() -> None:
        _ignore_all()
        default_signals()

    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, preexec_fn=ignore_then_default, timeout=30
    ).stdout.split()
    # SIGHUP and SIGTERM at SIG_DFL (0); SIGINT: Python's own KeyboardInterrupt handler, installed only when not ignored
    assert out == ["0", "python", "0"], out


def test_defaults_here_restores_what_was_there():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with defaults_here(signal.SIGHUP):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
