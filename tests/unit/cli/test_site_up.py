"""Issue 35 point 1, what the user sees: `make smoke` and `make down` act on the stack that is up, whichever runtime or
device, without DEVICE= or RUNTIME= repeated. With the CPU Docker stack up (its record .run/docker-state.cpu.json, its
containers running), `polarstack smoke`, `make smoke` and `make down` act on the CPU stack (its own Compose project and
ports, polarstack.stack.device); with the local runtime's stack and the CPU one both up, smoke and down refuse (STATE)
naming both and the command for each; the advice after an engine died names DEVICE=cpu / RUNTIME=local. Before the
site (polarstack.cli.site), the first two said nothing was up (or stopped the node's project) and the advice named
neither. Runs against the fake node (tests/fake_node.py) and hand-written run states: no Docker, no process started."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_node
from polarstack import processes
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.pins import repo_root
from polarstack.stack import device

pytestmark = pytest.mark.unit
ROOT = repo_root()
CPU_BASE_URL = f"http://127.0.0.1:{device.CPU_PORTS['ENGINE_PORT_BASE']}"  # engine-direct on the CPU stack's ports


def trainer_report() -> str:  # what `polarstack smoke --in-trainer --json` prints on a path that passes
    return json.dumps(
        {
            "verdict": "pass",
            "exit_code": 0,
            "code": "OK",
            "message": "2 requests, 18 trainable tokens",
            "route": "base",
            "base_url": CPU_BASE_URL,
            "model": "m",
            "polar_verdict": "trainable",
            "installed_polar": "skipped",
            "trainable_tokens": 18,
            "requests": [],
        }
    )


@pytest.fixture
def cpu_up(tmp_path, monkeypatch):
    """The fake node with engine-direct up on the CPU stack (its record written as `make up DEVICE=cpu` writes it), and
    no DEVICE in the environment."""
    log = fake_node.install(tmp_path, monkeypatch)
    for key in (device.DEVICE_ENV, "POLARSTACK_CPU_PROJECT", "RUNTIME", "DEVICE", *device.CPU_PORTS, "MODEL_PATH"):
        monkeypatch.delenv(key, raising=False)
    run = tmp_path / "run"
    run.mkdir()
    record = {"profile": "engine-direct", "runtime": "docker", "started_at": 1.0, "base_url": CPU_BASE_URL}
    (run / device.CPU_STATE_FILE).write_text(json.dumps({**record, "route": "base", "device": "cpu"}))
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 trainer")
    monkeypatch.setenv("FAKE_TRAINER_SMOKE", trainer_report())
    return log


def compose_calls(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("compose ")]


def local_state(run: Path) -> None:
    """A local stack of engine-direct whose recorded process is this test process (alive and owned)."""
    me = os.getpid()
    (run / "state.json").write_text(
        json.dumps(
            {
                "profile": "engine-direct",
                "runtime": "local",
                "route": "polar",
                "base_url": "http://127.0.0.1:9",
                "engine_urls": ["http://127.0.0.1:9"],
                "processes": [{"role": "engine-0", "pid": me, "start_time": processes.start_time(me), "port": 9}],
            }
        )
    )


def make(*words: str) -> subprocess.CompletedProcess:
    """`make WORDS` with this interpreter's venv as the project's (nothing installed), in the test's environment."""
    venv = Path(sys.executable).parent.parent
    return subprocess.run(
        ["make", "-o", f"{venv}/.installed", f"VENV={venv}", *words],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_smoke_without_device_runs_in_the_trainer_of_the_cpu_stack_that_is_up(cpu_up, capsys):
    assert main(["smoke"]) == 0
    call = compose_calls(cpu_up)[-1]
    assert call.startswith(f"compose -p {device.CPU_PROJECT} ") and "exec -T trainer polarstack smoke" in call
    assert "Polar's second opinion inside the trainer: skipped on DEVICE=cpu" in capsys.readouterr().err
    assert device.DEVICE_ENV not in os.environ  # the site's device lasts the command, not the process


def test_make_smoke_and_make_down_without_device_act_on_the_cpu_stack(cpu_up, tmp_path):
    proc = make("smoke")
    assert proc.returncode == 0, proc.stderr
    assert compose_calls(cpu_up)[-1].startswith(f"compose -p {device.CPU_PROJECT} ")
    proc = make("down")
    assert proc.returncode == 0, proc.stderr
    assert compose_calls(cpu_up)[-1].startswith(f"compose -p {device.CPU_PROJECT} ")
    assert compose_calls(cpu_up)[-1].endswith("--profile engine-direct down")
    assert not (tmp_path / "run" / device.CPU_STATE_FILE).exists()  # the record of the CPU stack is gone


@pytest.mark.parametrize("verb", ["smoke", "down"])
def test_the_local_stack_and_the_cpu_stack_up_at_once_are_both_named(cpu_up, tmp_path, verb):
    local_state(tmp_path / "run")
    proc = make(verb)
    assert f"polarstack exited with code {int(ExitCode.STATE)} (STATE)" in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("polarstack: ")]
    assert len(said) == 1, proc.stderr
    assert "profile engine-direct locally" in said[0] and "under Docker on DEVICE=cpu" in said[0]
    assert f"`make {verb} RUNTIME=local`" in said[0] and f"`make {verb} RUNTIME=docker DEVICE=cpu`" in said[0]
    assert not any(" exec " in c or c.endswith(" down") for c in compose_calls(cpu_up))  # acted on neither
    assert (tmp_path / "run" / "state.json").exists() and (tmp_path / "run" / device.CPU_STATE_FILE).exists()


def test_with_both_up_the_cli_refuses_smoke_and_acts_on_the_runtime_named(cpu_up, tmp_path, capsys):
    local_state(tmp_path / "run")
    assert main(["smoke"]) == ExitCode.STATE
    assert "2 stacks are up" in capsys.readouterr().err
    assert main(["down", "--runtime", "auto"]) == ExitCode.STATE
    assert main(["smoke", "--runtime", "docker"]) == 0  # told which: the CPU stack, DEVICE found from its record
    assert compose_calls(cpu_up)[-1].startswith(f"compose -p {device.CPU_PROJECT} ")


def test_the_advice_after_an_engine_of_the_cpu_stack_died_names_device_cpu(cpu_up, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUNNING", "trainer")
    monkeypatch.setenv("FAKE_EXITED", "engine-0")
    assert main(["smoke"]) == ExitCode.STATE
    err = capsys.readouterr().err
    assert "engine-0 (exited)" in err
    for advice in (
        "`make logs PROFILE=engine-direct DEVICE=cpu`",
        "`make down PROFILE=engine-direct DEVICE=cpu`",
        "`make up PROFILE=engine-direct DEVICE=cpu`",
    ):
        assert advice in err, err


def test_the_advice_after_the_local_stack_died_names_runtime_local_and_its_profile(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path))
    local_state(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    state["processes"][0]["start_time"] = -1  # not the process `up` started: the stack died
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert main(["smoke"]) == ExitCode.STATE
    err = capsys.readouterr().err
    assert "`make down RUNTIME=local`" in err and "`make up PROFILE=engine-direct RUNTIME=local`" in err
