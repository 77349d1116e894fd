"""Pins the start-up deadlines of shared fixtures (issue 34 point 2): one rule, polarstack.processes.startup_seconds
(base x max(1, load / cores), at least the base, at most STARTUP_CEILING_FACTOR x base or the caller's ceiling), in
place of the constant 30 s that a stand-in engine missed at load 10 on 2 cores; and a shared fixture that failed to
start is reported once with its log, every later test that needed it in one line (tests/fixture_failures.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polarstack import processes
from polarstack.errors import StackError

pytestmark = pytest.mark.unit
TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "load, cores, expected",
    [
        (0.3, 2, 30.0),  # quiet: the base
        (2.0, 2, 30.0),  # busy but not overloaded
        (6.0, 2, 90.0),  # load 6 on 2 cores: three times as long
        (10.0, 2, 120.0),  # load 10 on 2 cores: five times, held at the ceiling (4 x base)
        (10.0, 16, 30.0),  # the same load on 16 cores is no overload
    ],
)
def test_the_deadline_grows_with_the_load_per_core_between_floor_and_ceiling(load, cores, expected):
    assert processes.startup_seconds(30.0, load=load, cores=cores) == expected


def test_a_callers_ceiling_bounds_it_but_never_below_the_base():
    assert processes.startup_seconds(120.0, ceiling=240.0, load=20.0, cores=2) == 240.0
    assert processes.startup_seconds(120.0, ceiling=60.0, load=20.0, cores=2) == 120.0


def test_it_reads_this_machines_load_and_cores(monkeypatch):
    monkeypatch.setattr(processes.os, "getloadavg", lambda: (1.0, 8.0, 3.0))  # the 5-minute average is larger
    monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid: {0, 1})
    assert processes.startup_seconds(30.0) == 120.0


def _root_conftest(config):
    """tests/conftest.py as pytest loaded it: `import conftest` finds whichever conftest a worker imported last
    (tests/sglang/conftest.py too), so look it up among pytest's plugins by its file."""
    path = str(Path(__file__).resolve().parents[1] / "conftest.py")
    found = [m for m in config.pluginmanager.get_plugins() if getattr(m, "__file__", None) == path]
    assert found, "tests/conftest.py is not loaded"
    return found[0]


def test_the_engine_fixture_waits_by_the_rule_and_fails_with_its_log(monkeypatch, tmp_path, pytestconfig):
    """The session fixture `engine` asks start_emulator for startup_seconds(30) and, when the start fails, fails the
    test with the emulator's log lines instead of a bare timeout."""
    conftest = _root_conftest(pytestconfig)
    seen = {}

    def start(**kwargs):
        seen.update(kwargs)
        kwargs["log_path"].write_text("emulator: still loading the tokenizer\n")
        raise StackError("http://127.0.0.1:1/health did not answer 2xx within 120 s.")

    monkeypatch.setattr(conftest, "start_emulator", start)
    monkeypatch.setattr(conftest, "startup_seconds", lambda base, **kw: base * 4)

    class Factory:
        def mktemp(self, name):
            (tmp_path / name).mkdir()
            return tmp_path / name

    with pytest.raises(pytest.fail.Exception) as failed:
        next(conftest.engine.__wrapped__(Factory()))
    assert seen["timeout"] == 120.0
    assert "still loading the tokenizer" in str(failed.value) and "within 120 s" in str(failed.value)


SUITE = """
import pytest

@pytest.fixture(scope="session")
def server():
    pytest.fail("the shared server did not start; its log:\\nLOG-LINE-1\\nLOG-LINE-2", pytrace=False)

@pytest.mark.parametrize("n", range(5))
def test_needs_the_server(server, n):
    pass

def test_without_it():
    pass
"""


def test_a_failed_shared_fixture_is_one_full_error_and_one_line_for_each_later_test(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "fixture_failures"]
        + ["-q", "-rN", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 passed, 5 errors" in out, out
    assert out.count("LOG-LINE-2") == 1, out  # the first error in full, with the log
    pointers = [line for line in out.splitlines() if "a shared fixture failed to start, first in" in line]
    assert len(pointers) == 4, out  # each later test: one line
    assert all("test_needs_the_server[0]" in line for line in pointers), out


def test_the_averages_lag_so_the_tasks_runnable_now_count_too(monkeypatch):
    """A load that began seconds ago shows in /proc/loadavg's runnable count before the 1-minute average."""
    monkeypatch.setattr(processes.os, "getloadavg", lambda: (0.2, 0.1, 0.1))
    monkeypatch.setattr(processes.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(processes, "runnable_now", lambda: 6.0)
    assert processes.startup_seconds(30.0) == 90.0
    monkeypatch.setattr(processes, "runnable_now", lambda: 0.0)
    assert processes.startup_seconds(30.0) == 30.0


@pytest.mark.parametrize(
    "text, expected",
    [("0.50 0.40 0.30 9/321 4567\n", 8.0), ("0.00 0.00 0.00 1/80 12\n", 0.0), ("garbled\n", 0.0)],
)
def test_runnable_now_reads_the_fourth_field_without_the_reader(monkeypatch, tmp_path, text, expected):
    fake = tmp_path / "loadavg"
    fake.write_text(text)
    real_open = open
    monkeypatch.setattr(
        processes,
        "open",
        lambda path, *a, **k: real_open(fake if path == "/proc/loadavg" else path, *a, **k),
        raising=False,
    )
    assert processes.runnable_now() == expected


def test_runnable_now_reads_this_machine():
    assert processes.runnable_now() >= 0.0


class _Item:
    def __init__(self, marker, ini):
        self._marker, self.config = marker, type("Config", (), {"getini": staticmethod(lambda name: ini)})()

    def get_closest_marker(self, name):
        return self._marker if name == "timeout" else None


@pytest.mark.parametrize(
    "marker, ini, expected",
    [
        (None, 300, 1200.0),  # pyproject's 300 s, four times at the ceiling
        (pytest.mark.timeout(900).mark, 300, 3600.0),  # a tier's own marker is the base
        (pytest.mark.timeout(timeout=50).mark, 300, 200.0),
        (None, 0, None),  # no timeout configured: none added
    ],
)
def test_pytests_per_test_timeout_follows_the_rule(monkeypatch, pytestconfig, marker, ini, expected):
    conftest = _root_conftest(pytestconfig)
    monkeypatch.setattr(conftest, "startup_seconds", lambda base, **kw: base * 4)
    assert conftest.scaled_timeout(_Item(marker, ini)) == expected


def test_this_test_runs_under_the_scaled_timeout(request):
    """The hook in tests/conftest.py put the scaled timeout first among this test's markers, where pytest-timeout's
    `_get_item_settings` (pytest-timeout 2.4.0) reads it."""
    timeout = request.node.get_closest_marker("timeout").args[0]
    assert 300.0 <= timeout <= 300.0 * processes.STARTUP_CEILING_FACTOR
