"""Pins the local runtime's refusals at NODES>1 before anything starts (issue 28 point 4): engine-direct (no router),
the real engine, an interface that is not there, a node of rank > 0 without the head's token, a port taken; the
sentence rank 0 says when another node's engines never answer; and the Ray node's stop by its session (leader gone
or not). The cluster itself runs in tests/cluster (network namespaces)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.processes import start_time
from polarstack.stack import cluster, local, profiles, ray_node
from polarstack.stack.cluster import NodeLayout
from polarstack.stack.listeners import session_pids

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import time_wait  # noqa: E402

pytestmark = pytest.mark.unit

ADDRS = "198.18.250.1,198.18.250.2"


@pytest.fixture
def knobs(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("NODES", "2")
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv("CLUSTER_IFACE", "psnothere0")
    monkeypatch.setenv("NODE_ADDRS", ADDRS)
    monkeypatch.setenv("RAY_AUTH_TOKEN_FILE", str(tmp_path / "secrets" / "ray-auth-token"))
    return tmp_path


def nothing_started(tmp_path) -> bool:
    return not (tmp_path / "run" / "state.json").exists()


def test_engine_direct_is_refused_before_anything_starts(knobs, capsys):
    assert main(["up", "--profile", "engine-direct"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "has no router" in err and "NODES=2" in err and "router-passthrough or patched-router" in err
    assert nothing_started(knobs)


def test_the_real_engine_is_refused_at_two_nodes(knobs, capsys):
    assert main(["up", "--profile", "patched-router", "--engine", "sglang"]) == ExitCode.USAGE
    assert "emulated engines only" in capsys.readouterr().err
    assert nothing_started(knobs)


def test_an_interface_that_is_not_there_is_named(knobs, capsys):
    assert main(["up", "--profile", "patched-router"]) == ExitCode.ENVIRONMENT
    assert "CLUSTER_IFACE=psnothere0 is not an interface of this node" in capsys.readouterr().err
    assert nothing_started(knobs)
    assert not (knobs / "secrets" / "ray-auth-token").exists()  # nothing written either


def test_a_worker_node_needs_the_heads_token(knobs, monkeypatch):
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setattr(cluster.Cluster, "bind_host", lambda self: self.addr)
    with pytest.raises(StackError) as raised:
        local.up(profiles.load("patched-router"), cluster=cluster.load())
    assert raised.value.code == ExitCode.STATE and "no Ray token at" in raised.value.message
    assert nothing_started(knobs)


def test_a_taken_engine_port_is_refused_naming_the_knob(knobs, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("ENGINE_PORT_BASE", str(taken.getsockname()[1]))
        monkeypatch.setattr(cluster.Cluster, "bind_host", lambda self: "127.0.0.1")
        with pytest.raises(StackError) as raised:
            local.up(profiles.load("patched-router"), cluster=cluster.load())
    assert raised.value.code == ExitCode.STATE
    assert "engine-0 needs 127.0.0.1:" in raised.value.message and "ENGINE_PORT_BASE" in raised.value.message
    assert nothing_started(knobs) and not (knobs / "secrets" / "ray-auth-token").exists()


def test_a_port_left_in_time_wait_is_not_refused():
    """The local runtime's check at NODES>1 is the docker runtime's (processes.port_taken): TIME_WAIT is free."""
    port = time_wait.leave_time_wait()
    local.check_port_free("127.0.0.1", port, "engine-0", "ENGINE_PORT_BASE")  # no StackError


def test_rank_0_names_the_node_whose_engines_never_answer():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: connection refused
        node = NodeLayout(1, "198.18.250.2", ("ray-worker",), (0, 1), (2, 3), (url,))
        began = time.monotonic()
        with pytest.raises(StackError) as raised:
            local.wait_engines({url: node}, 0.5)
    assert raised.value.code == ExitCode.UNREACHABLE
    assert raised.value.message.startswith(f"engine {url} of node 1 (198.18.250.2) did not answer /health")
    assert "NODE_RANK=1" in raised.value.message and time.monotonic() - began < 5


@pytest.mark.parametrize("leader_exits", [False, True])
def test_a_ray_node_is_stopped_by_its_session(leader_exits):
    """`down` stops `ray start --block` and everything in its session, also what outlives a dead leader."""
    script = "sleep 60 & sleep 60 & " + ("exit 0" if leader_exits else "wait")
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    record = {"pid": leader.pid, "start_time": start_time(leader.pid), "session": True}
    deadline = time.monotonic() + 5
    while len(session_pids(leader.pid)) < (2 if leader_exits else 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    if leader_exits:
        leader.wait(timeout=5)
    members = session_pids(leader.pid)
    assert len(members) >= 2, members
    ray_node.stop_session(record, timeout=1)
    leader.poll()
    assert session_pids(leader.pid) == []
    assert all(not os.path.exists(f"/proc/{pid}") or start_time(pid) is None for pid in members)
