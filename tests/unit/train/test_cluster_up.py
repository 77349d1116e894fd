"""Pins what `make up` adds at NODES>1 on each node (polarstack.train.cluster_up before_up / after_up, which the docker
runtime's `up` runs; they lived in cli/cluster.py before issue 35 point 2): it refuses, in one
sentence, a CLUSTER_IFACE that does not hold this node's address (ENVIRONMENT), a node other than the head without a
copy of the head's token (STATE), a SHARED_DIR that is not there (ENVIRONMENT); the head writes the token (mode 0600)
when missing. After the stack is up it writes this node's report, and runs the cluster check only once every node's
report of the head's session is in, else names the nodes it waits for."""

import stat

import pytest

from polarstack.checks import nodes
from polarstack.cli.cluster import render_cluster_check
from polarstack.errors import ExitCode, StackError
from polarstack.stack import compose, profiles
from polarstack.stack.cluster import Cluster
from polarstack.train import cluster_up

pytestmark = pytest.mark.unit


def make(tmp_path, rank=0, iface="lo", addrs=("127.0.0.1", "127.0.0.2"), shared=None, token=None):
    shared_dir = tmp_path / "shared" if shared is None else shared
    if shared is None:
        shared_dir.mkdir(exist_ok=True)
    return Cluster(2, rank, iface, addrs, str(token or tmp_path / "cfg" / "ray-auth-token"), str(shared_dir))


def test_the_head_writes_its_token_and_passes(tmp_path):
    found = make(tmp_path)
    cluster_up.before_up(found)
    token = tmp_path / "cfg" / "ray-auth-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) == 64


def test_the_head_opens_the_session_before_anything_starts(tmp_path, capsys):
    """So a node whose `make up` ends before the head's reports into the head's current session (node review)."""
    found = make(tmp_path)
    with pytest.raises(StackError):
        nodes.read_session(found)
    cluster_up.before_up(found)  # the checks open nothing: a refusal after them leaves the reports as they were
    with pytest.raises(StackError):
        nodes.read_session(found)
    cluster_up.open_session(profiles.load("router-passthrough"), found)
    first = nodes.read_session(found)["id"]
    assert "run `make up PROFILE=router-passthrough` on node 1 (127.0.0.2) now" in capsys.readouterr().err
    cluster_up.open_session(profiles.load("patched-router"), found)  # a later bring-up: new session, old reports stale
    assert nodes.read_session(found)["id"] != first and capsys.readouterr().err == ""
    cluster_up.open_session(profiles.load("patched-router"), make(tmp_path, rank=1))  # only the head opens one


def test_an_interface_without_this_nodes_address_is_refused(tmp_path):
    with pytest.raises(StackError) as caught:
        cluster_up.before_up(make(tmp_path, rank=1))  # lo holds 127.0.0.1, not 127.0.0.2 (no alias here)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert "CLUSTER_IFACE=lo holds 127.0.0.1, not NODE_ADDRS[1]=127.0.0.2" in caught.value.message


def test_another_node_without_the_heads_token_is_refused(tmp_path):
    found = make(tmp_path, rank=1, addrs=("127.0.0.2", "127.0.0.1"))
    with pytest.raises(StackError) as caught:
        cluster_up.before_up(found)
    assert (
        caught.value.code == ExitCode.STATE and "copy that file to the same path on this node" in caught.value.message
    )


def test_a_missing_shared_dir_is_refused(tmp_path):
    found = make(tmp_path, shared=tmp_path / "not-mounted")
    with pytest.raises(StackError) as caught:
        cluster_up.before_up(found)
    assert caught.value.code == ExitCode.ENVIRONMENT
    assert caught.value.message.startswith(f"SHARED_DIR={tmp_path / 'not-mounted'} is not a directory on this node")


def test_after_up_waits_for_the_other_nodes_then_checks(tmp_path, monkeypatch, capsys):
    profile = profiles.load("patched-router")
    found = make(tmp_path)
    written, checked = [], []
    monkeypatch.setattr(cluster_up.compose, "render_values", lambda p, c, *, cpu: {})
    monkeypatch.setattr(
        nodes, "write_report", lambda c, p, v, *, cpu: written.append(c.rank) or tmp_path / f"rank-{c.rank}"
    )
    monkeypatch.setattr(nodes, "pending", lambda c: [1])
    monkeypatch.setattr(
        cluster_up, "check_cluster", lambda p, c: checked.append(c.rank) or nodes.ClusterReport(2, "s", [])
    )
    cluster_up.after_up(profile, compose.Place(False, found), render_cluster_check)
    assert written == [0] and checked == []
    assert "waiting for `make up` on node 1 (127.0.0.2)" in capsys.readouterr().err
    monkeypatch.setattr(nodes, "pending", lambda c: [])
    cluster_up.after_up(profile, compose.Place(False, found), render_cluster_check)
    assert checked == [0] and "cluster:" in capsys.readouterr().out
