"""Pins the node's port accounting (polarstack.stack.ports, issue 34 point 5): every fixed port the node binds is
listed with what binds it, Ray's client server and dashboard agent included; Polar's two ports, bound while Ray runs,
lie outside the range the pinned ray hands its workers (10002-19999) and below its random picks; `make train` refuses a
plan that puts them there, `make up` probes Ray's fixed ports too, and the recorded facts mean what the accounting
says (configs/upstream/ray-listeners.json, scripts/tools/record_ray_listeners.py)."""

import copy
import json
import socket

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.pins import repo_root
from polarstack.stack import ports, profiles, stack_faults

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_local_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def test_every_fixed_port_of_the_node_is_accounted_for():
    bound = {p.port: p for p in ports.node_ports(profiles.load("patched-router"), load_defaults()["polar"])}
    for port in (30000, 30010, 30080, 30081, 6379, 8265, 10001, 52365, 44217, 44227):
        assert port in bound, port
    assert bound[10001].what == "the trainer's Ray client server"
    assert bound[52365].what == "the trainer's Ray dashboard agent"
    polar = [p for p in bound.values() if p.while_ray_runs]
    assert {p.what for p in polar} == {"Polar's rollout server", "Polar's gateway"}


def test_sglang_router_0_1_4_binds_no_metrics_port():
    """router-passthrough's release has no --prometheus-port (measured: it listens on ROUTER_PORT alone)."""
    found = {p.port for p in ports.node_ports(profiles.load("router-passthrough"))}
    assert 30080 in found and 30081 not in found


@pytest.mark.parametrize("name", profiles.available())
def test_the_shipped_plan_has_no_port_collision(name):
    assert ports.problems(profiles.load(name), load_defaults()["polar"], ephemeral=32768) == []


def test_polar_ports_lie_outside_rays_worker_range():
    low, high = ports.worker_range()
    polar = load_defaults()["polar"]
    assert (low, high) == (10002, 19999)
    for key in ("rollout_port", "gateway_port"):
        assert not low <= polar[key] <= high


def test_a_polar_port_in_rays_worker_range_is_refused():
    polar = {"rollout_port": 18080, "gateway_port": 28090}
    found = ports.problems(profiles.load("engine-direct"), polar, ephemeral=32768)
    assert (
        len(found) == 1 and "Polar's rollout server's port 18080 (polar.rollout_port) lies in 10002-19999" in found[0]
    )


def test_a_polar_port_among_rays_random_picks_is_refused():
    found = ports.problems(
        profiles.load("engine-direct"), {"rollout_port": 40000, "gateway_port": 28090}, ephemeral=32768
    )
    assert len(found) == 1 and "at or above 32768" in found[0]


def test_two_owners_of_one_port_are_refused():
    found = ports.problems(
        profiles.load("engine-direct"), {"rollout_port": 10001, "gateway_port": 28090}, ephemeral=32768
    )
    assert any("port 10001 is both the trainer's Ray client server's" in p for p in found)


def test_make_train_refuses_polar_in_rays_worker_range(capsys):
    code = main(["train", "--task", "humaneval", "--dry-run", "--set", "polar.gateway_port=18100"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "Polar's gateway's port 18100 (polar.gateway_port) lies in 10002-19999" in err


def test_make_up_probes_rays_fixed_ports(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        fixed = dict.fromkeys(ports.RAY_FIXED, 0)
        fixed["client_server"] = port
        monkeypatch.setattr(ports, "ray_fixed_ports", lambda data=None: fixed)
        with socket.socket() as probe:  # the engine on a free port, Ray's GCS and dashboard unprobed
            probe.bind(("127.0.0.1", 0))
            monkeypatch.setenv("ENGINE_PORT_BASE", str(probe.getsockname()[1]))
        for key in ("RAY_GCS_PORT", "RAY_DASHBOARD_PORT"):
            monkeypatch.setenv(key, "0")
        with pytest.raises(StackError) as info:
            stack_faults.refuse_taken_ports(profiles.load("engine-direct"))
    assert info.value.code == ExitCode.STATE
    assert f"port {port} (the trainer's Ray client server of profile engine-direct)" in info.value.message


def test_the_record_means_what_the_accounting_says():
    assert ports.record_problems() == []


def _record():
    return copy.deepcopy(json.loads((repo_root() / ports.RECORD).read_text()))


def test_record_problems_catch_a_moved_or_unaccounted_listener():
    data = _record()
    row = next(r for r in data["with_loopback_env"] if r["port_kind"] == "client_server")
    row["port_kind"], row["port"] = "random", "RANDOM"  # the client server no longer seen on a fixed port
    assert any("client_server" in p for p in ports.record_problems(data))
    data = _record()
    data["with_loopback_env"].append(
        {"server": "x", "address": "127.0.0.1", "loopback": True, "port": 7, "port_kind": "?"}
    )
    assert any("port 7" in p for p in ports.record_problems(data))
    data = _record()
    row = next(r for r in data["with_loopback_env"] if r["port_kind"] == "dashboard_agent")
    row["port"] = 52366  # measured elsewhere than the default the accounting uses
    assert any("dashboard_agent" in p for p in ports.record_problems(data))
    data = _record()
    data["random_ports"]["lowest_seen"] = 20000  # a random pick below the ephemeral range: the rule does not hold
    assert any("random" in p for p in ports.record_problems(data))


def test_polars_gateway_on_the_in_session_proxys_default_port_is_refused():
    """The second node-path review's finding 2: Polar's apptainer broker listens on 28100 inside a session when it
    proxies (configs/upstream/polar-apptainer.json broker_proxy_port), and the sessions share the trainer's network;
    the gateway was moved to 28090, and a gateway put back on 28100 is refused."""
    found = ports.problems(
        profiles.load("engine-direct"), {"rollout_port": 28080, "gateway_port": 28100}, ephemeral=32768
    )
    assert len(found) == 1 and "port 28100 is both Polar's gateway's" in found[0], found
    assert "Polar's in-session HTTP proxy" in found[0]
    assert ports.problems(profiles.load("engine-direct"), load_defaults()["polar"], ephemeral=32768) == []
