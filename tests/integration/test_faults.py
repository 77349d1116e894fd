"""Fault injection on the token path: every failure ends in its documented exit code within a bounded time,
nothing hangs, no process is left behind, and `polarstack train` (`make train`) never launches.

Engines are the emulator (faults via /_emulator/fault); routers are the real pinned wheels."""

import json
import os
import signal
import threading
import time

import pytest

from conftest import FAULT_EXIT_CODES
from polarstack import processes
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import pin
from polarstack.stack import local

pytestmark = pytest.mark.router
PATCHED = f"{pin('ROUTER_PATCHED_PACKAGE')}=={pin('ROUTER_PATCHED_VERSION')}"


def gone(pid: int) -> bool:
    return processes.start_time(pid) is None


def test_engine_killed_during_a_smoke(engine_factory):
    engine = engine_factory()
    engine.fault("delay", seconds=3)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(report=run_smoke(SmokeTarget(engine.url), SmokeOptions(timeout=8)))
    )
    started = time.monotonic()
    thread.start()
    time.sleep(1.0)
    os.kill(engine.process.pid, signal.SIGKILL)
    thread.join(timeout=15)
    assert not thread.is_alive(), "smoke hung after the engine died"
    assert result["report"].code == ExitCode.UNREACHABLE
    assert time.monotonic() - started < 10
    engine.process.wait(timeout=5)
    assert gone(engine.process.pid)


def test_router_killed(engine, router_factory):
    router = router_factory(PATCHED, [engine.url])
    os.kill(router.pid, signal.SIGKILL)
    router.process.wait(timeout=5)
    report = run_smoke(SmokeTarget(router.url), SmokeOptions(timeout=5))
    assert report.code == ExitCode.UNREACHABLE and "nothing accepts connections" in report.message
    assert gone(router.pid)


def test_router_restarted_between_two_smokes(engine, router_factory):
    first = router_factory(PATCHED, [engine.url])
    assert run_smoke(SmokeTarget(first.url), SmokeOptions()).ok
    port = first.port
    first.stop(timeout=2.0)
    assert gone(first.pid)
    second = router_factory(PATCHED, [engine.url], port=port)
    report = run_smoke(SmokeTarget(second.url), SmokeOptions())
    assert report.ok, report.message


def test_engine_slower_than_the_timeout_does_not_hang(engine_factory):
    engine = engine_factory()
    engine.fault("delay", seconds=5)
    started = time.monotonic()
    report = run_smoke(SmokeTarget(engine.url), SmokeOptions(timeout=1.0, requests=1, turns=0))
    assert report.code == ExitCode.UNREACHABLE and "did not answer within 1 s" in report.message
    assert time.monotonic() - started < 4


@pytest.fixture
def local_engine_direct(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    assert main(["up", "--profile", "engine-direct"]) == 0
    state = local.read_state()
    yield state
    pids = [p["pid"] for p in state.processes]
    local.down(directory=tmp_path / "run")
    assert all(gone(pid) for pid in pids), "a process survived `down`"


@pytest.mark.parametrize("mode,smoke_code", FAULT_EXIT_CODES)
def test_each_fault_has_its_code_and_blocks_training(local_engine_direct, capsys, mode, smoke_code):
    import httpx

    engine_url = local_engine_direct.data["engine_urls"][0]
    httpx.post(f"{engine_url}/_emulator/fault", json={"mode": mode}).raise_for_status()
    capsys.readouterr()
    assert main(["smoke", "--json"]) == smoke_code
    assert json.loads(capsys.readouterr().out)["code"] == smoke_code.name
    started = time.monotonic()
    assert main(["train", "--task", "humaneval"]) == ExitCode.GATE
    err = capsys.readouterr().err
    assert "refusing to launch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - started < 15
    assert not (local.run_dir() / "train").exists()
