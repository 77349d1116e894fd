"""Faults of the Docker runtime on a real engine (DEVICE=cpu: real sglang in containers built from
images/engine/Dockerfile), each with the exit code and sentence docs/docker-cpu.md ("Faults") states:
a bad PROFILE (2), `make up` twice (0, saying so; nothing recreated), a port already taken at `make up` (9), `make smoke` and `make train
DRY_RUN=1` inside the stack (0; Polar's checks skipped by name), an engine container killed during `make smoke` (5),
the smoke after it (9), `make down` twice (0, the second says nothing is up), Ctrl-C during `make up` (130, nothing
left), a healthcheck that never passes (8, naming the service and its start period)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from docker_env import SPARE_PORTS, TIER_PORTS, cpu_environment

from default_signals import default_signals
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.stack import docker_state

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]
PROJECT = "polarstack-tier"


def containers(project: str) -> list[str]:
    proc = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line for line in proc.stdout.splitlines() if line.strip())


@pytest.fixture(scope="module")
def stack(docker_engine):
    """engine-direct up under the tier's own project: one real engine and the trainer (the cheapest stack)."""
    with pytest.MonkeyPatch.context() as mp:
        cpu_environment(mp, PROJECT, TIER_PORTS)
        started = time.monotonic()
        code = main(["compose", "up", "--profile", "engine-direct"])
        assert code == 0, "make up DEVICE=cpu PROFILE=engine-direct failed; see the output above"
        print(f"docker tier: engine-direct up in {time.monotonic() - started:.0f} s", file=sys.stderr)
        try:
            yield mp
        finally:
            main(["compose", "down", "--profile", "engine-direct"])


def test_a_bad_profile_is_refused_in_one_sentence(docker_engine, monkeypatch, capsys):
    cpu_environment(monkeypatch, PROJECT + "-bad", SPARE_PORTS)
    assert main(["compose", "up", "--profile", "no-such-profile"]) == ExitCode.USAGE
    assert "unknown profile 'no-such-profile'; choose one of" in capsys.readouterr().err


def test_up_twice_says_so_and_recreates_nothing(stack, capsys):
    before = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert main(["compose", "up", "--profile", "engine-direct"]) == 0
    assert "profile engine-direct is already up under Docker (polarstack-tier); nothing started or recreated" in (
        capsys.readouterr().err
    )
    after = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(before) == sorted(after)


def test_a_taken_port_is_refused_before_anything_starts(stack, monkeypatch, capsys):
    other = PROJECT + "-ports"
    monkeypatch.setenv("POLARSTACK_CPU_PROJECT", other)  # another stack on the same ports: the engine holds 33000
    assert main(["compose", "up", "--profile", "engine-direct"]) == ExitCode.STATE
    err = capsys.readouterr().err
    assert "port 33000 (engine-0 of profile engine-direct) is already taken on 127.0.0.1" in err
    assert "ENGINE_PORT_BASE=<another port>" in err
    assert containers(other) == []


def test_smoke_and_train_dry_run_run_inside_the_stack(stack, capsys):
    assert main(["smoke", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["verdict"] == "pass" and report["trainable_tokens"] > 0
    assert "Polar's second opinion inside the trainer: skipped on DEVICE=cpu" in captured.err
    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0


def _kill_when_asked(container: str, since: float, done: threading.Event) -> None:
    """Kill `container` once its log shows a chat request after `since` (the smoke is then under way)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not done.is_set():
        logs = subprocess.run(["docker", "logs", "--since", str(int(since)), container], capture_output=True, text=True)
        if "/v1/chat/completions" in logs.stdout + logs.stderr:
            subprocess.run(["docker", "kill", container], capture_output=True)
            return
        time.sleep(0.3)


def test_an_engine_killed_during_smoke_is_unreachable_then_state(stack, capsys):
    engine = f"{PROJECT}-engine-0-1"
    done = threading.Event()
    killer = threading.Thread(target=_kill_when_asked, args=(engine, time.time() - 1, done), daemon=True)
    killer.start()
    try:
        code = main(["smoke"])
    finally:
        done.set()
        killer.join(timeout=10)
    err = capsys.readouterr().err
    assert code == ExitCode.UNREACHABLE, err
    # afterwards the record is no longer true: STATE, naming the service that stopped
    assert main(["smoke"]) == ExitCode.STATE
    assert "is not running (engine-0 (exited))" in capsys.readouterr().err


def test_down_twice_says_nothing_is_up_the_second_time(stack, capsys):
    assert main(["compose", "down", "--profile", "engine-direct"]) == 0
    assert containers(PROJECT) == [] and docker_state.read(cpu=True) is None
    capsys.readouterr()
    assert main(["compose", "down", "--profile", "engine-direct"]) == 0
    assert "nothing of profile engine-direct is up under Docker (polarstack-tier); nothing to stop." in (
        capsys.readouterr().err
    )


def _cli(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "polarstack"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: SIGINT to the group is what Ctrl-C in a terminal sends
        # ... to processes that did not inherit SIGINT ignored (a shell's background job would have; a terminal's not)
        preexec_fn=default_signals,
    )


def test_ctrl_c_during_up_leaves_nothing_behind(docker_engine, monkeypatch):
    project = PROJECT + "-interrupt"
    cpu_environment(monkeypatch, project, SPARE_PORTS)
    process = _cli(dict(os.environ), "compose", "up", "--profile", "engine-direct")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not any("engine-0" in c for c in containers(project)):
        if process.poll() is not None:
            pytest.fail(f"make up ended ({process.returncode}) before its engine started: {process.communicate()[1]}")
        time.sleep(0.5)
    assert any("engine-0" in c for c in containers(project)), "make up never created its engine container"
    time.sleep(2)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=180)
    assert process.returncode == 130, err
    assert "interrupted: took down what `make up` had started for profile engine-direct" in err
    assert containers(project) == []
    assert docker_state.read(cpu=True) is None


def test_a_healthcheck_that_never_passes_names_the_engine(docker_engine, monkeypatch, capsys):
    project = PROJECT + "-unhealthy"
    # the engine listens elsewhere than its healthcheck asks (the last --port wins in sglang's parser)
    cpu_environment(monkeypatch, project, SPARE_PORTS, ENGINE_EXTRA_ARGS="--port 34555", ENGINE_START_PERIOD="5s")
    started = time.monotonic()
    try:
        code = main(["compose", "up", "--profile", "engine-direct"])
        err = capsys.readouterr().err
        assert code == ExitCode.ENVIRONMENT, err
        assert "engine-0 of profile engine-direct never passed its healthcheck (start period " in err
        assert (
            "ENGINE_START_PERIOD=5s, then 3 failed checks 2 s apart); see `make logs SERVICE=engine-0 DEVICE=cpu`"
            in err
        )
        print(f"docker tier: unhealthy engine reported after {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        main(["compose", "down", "--profile", "engine-direct"])
    assert containers(project) == []
