"""Pins `make up`'s fault sentences without Docker (polarstack.stack.stack_faults; the docker tier checks them on a
real engine): a taken port names the port, the service and the knob that moves it (STATE); a failed `up --wait`
names the service that never became healthy, with its start period, or the one that exited (ENVIRONMENT)."""

import socket
import sys
from pathlib import Path

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.processes import free_ports
from polarstack.stack import docker_state, ports, profiles, stack_faults
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import time_wait  # noqa: E402


@pytest.fixture(autouse=True)
def free_ray_fixed_ports(monkeypatch):
    """Ray's fixed ports (10001, 52365, ...) moved to free ones: a Ray head of another test may hold the real ones."""
    fixed = dict(zip(ports.RAY_FIXED, free_ports(len(ports.RAY_FIXED)), strict=True))
    monkeypatch.setattr(ports, "ray_fixed_ports", lambda data=None: fixed)


def test_a_taken_port_is_named_with_its_knob(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("ENGINE_PORT_BASE", str(port))
        monkeypatch.setenv("RAY_GCS_PORT", "0")
        monkeypatch.setenv("RAY_DASHBOARD_PORT", "0")
        profile = profiles.load("engine-direct")
        with pytest.raises(StackError) as info:
            stack_faults.refuse_taken_ports(profile)
    assert info.value.code == ExitCode.STATE
    assert f"port {port} (engine-0 of profile engine-direct) is already taken on 127.0.0.1" in info.value.message
    assert "ENGINE_PORT_BASE=<another port>" in info.value.message


def test_free_ports_pass(monkeypatch):
    for key in ("ENGINE_PORT_BASE", "RAY_GCS_PORT", "RAY_DASHBOARD_PORT"):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            monkeypatch.setenv(key, str(probe.getsockname()[1]))
    stack_faults.refuse_taken_ports(profiles.load("engine-direct"))


def test_ports_left_in_time_wait_by_a_stopped_stack_pass(monkeypatch):
    """`make up DEVICE=cpu` right after `make down DEVICE=cpu`: every port of the stack holds only TIME_WAIT
    connections, which the servers (SO_REUSEADDR) bind through; refused for 48 s before issue 34."""
    for key in ("ENGINE_PORT_BASE", "RAY_GCS_PORT", "RAY_DASHBOARD_PORT"):
        monkeypatch.setenv(key, str(time_wait.leave_time_wait()))
    stack_faults.refuse_taken_ports(profiles.load("engine-direct"))


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (
            {"engine-0": "unhealthy", "trainer": "created"},
            "engine-0 of profile engine-direct never passed its healthcheck (start period ENGINE_START_PERIOD=5s",
        ),
        (
            {"engine-0": "exited", "model-download": "exited"},
            "engine-0 of profile engine-direct exited during `make up`",
        ),
        ({}, "docker compose up failed for profile engine-direct (exit 1)"),
    ],
)
def test_a_failed_up_names_the_service(monkeypatch, states, expected):
    monkeypatch.setenv("ENGINE_START_PERIOD", "5s")
    monkeypatch.setattr(docker_state, "service_states", lambda profile, where: states)
    error = stack_faults.why_up_failed(profiles.load("engine-direct"), 1, read_now())
    assert error.code == ExitCode.ENVIRONMENT and expected in error.message


# --- the profile's images before `make up` (the GPU-node review's finding 10) ------------------------------------


@pytest.fixture
def node(tmp_path, monkeypatch):
    import fake_node

    log = fake_node.install(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_VOLUME", "1")  # weights, sandbox and apptainer present: only images can be missing
    return log


def compose_calls(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("compose ")]


@pytest.mark.parametrize(
    ("profile", "built", "missing"),
    [
        ("engine-direct", "model-download trainer", "polarstack/engine:{SGLANG_VERSION} (engine-0)"),
        (
            "patched-router",
            "model-download engine trainer",
            "polarstack/router:{ROUTER_PATCHED_PACKAGE}-{ROUTER_PATCHED_VERSION} (router)",
        ),
    ],
)
def test_make_up_without_make_build_refuses_naming_it(node, monkeypatch, capsys, profile, built, missing):
    """`make up` before `make build`: Compose built the missing images unasked, first inside the shape probe's
    captured `compose run` (tens of minutes without a line), or tried a registry. Now ASSETS_MISSING before any of it,
    naming the tags `compose config` gives and `make build`."""
    from polarstack.cli.main import main
    from polarstack.pins import pins

    monkeypatch.setenv("FAKE_IMAGES", built)
    assert main(["compose", "up", "--profile", profile]) == ExitCode.ASSETS_MISSING
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("polarstack:")]
    assert len(lines) == 1, lines
    assert missing.format(**pins()) in lines[0] and f"run `make build PROFILE={profile}` first" in lines[0]
    assert not any(" run " in c or " up " in c or " build" in c for c in compose_calls(node)), compose_calls(node)


def test_make_up_with_every_image_built_goes_on(node, monkeypatch):
    import fake_node
    from polarstack.cli.main import main

    monkeypatch.setenv("FAKE_IMAGES", fake_node.IMAGES)
    monkeypatch.setenv("FAKE_RUNNING", "engine-0 engine-1 router trainer")
    assert main(["compose", "up", "--profile", "patched-router"]) == 0
    assert any(c.endswith("up --detach --wait") for c in compose_calls(node))


def test_make_up_on_the_cpu_says_what_it_builds_then_builds_it_before_the_probe(node, monkeypatch, capsys):
    """DEVICE=cpu's `make up` builds (README, "Docker on a CPU machine"): it names the images, then `compose build`
    shows its progress, instead of the probe's captured `compose run` building the trainer silently."""
    from polarstack.checks import shape_probe
    from polarstack.cli.main import main
    from polarstack.stack import assets, device

    monkeypatch.setenv("POLARSTACK_DEVICE", "cpu")
    for key in [*device.CPU_PORTS, "MODEL_PATH", "ENGINE_START_PERIOD", "HEALTHCHECK_INTERVAL", "MODEL_DIR"]:
        monkeypatch.setenv(key, "")  # device.apply_cpu_defaults writes them into the environment: undone after
        monkeypatch.delenv(key)
    monkeypatch.setattr(device, "prepare", lambda progress: None)
    monkeypatch.setattr(assets, "check_before_up", lambda profile, **_: None)

    def probe(profile, where, running=False):
        raise StackError("the probe ran", ExitCode.GATE)

    monkeypatch.setattr(shape_probe, "check_docker", probe)
    monkeypatch.setenv("FAKE_IMAGES", "model-download trainer")
    assert main(["compose", "up", "--profile", "engine-direct"]) == ExitCode.GATE
    err = capsys.readouterr().err
    assert "make up DEVICE=cpu builds polarstack-cpu/engine:" in err and "(engine-0) first" in err
    assert [c.split(" --profile engine-direct ")[-1] for c in compose_calls(node) if " build" in c] == [
        "build engine-0"
    ]
