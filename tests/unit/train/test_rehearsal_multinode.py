"""Pins `make preflight` on 2 nodes with a fake node (issue 28 point 5): after the head is up the rehearsal waits for
every other node and runs the cluster check (Node.join), proves SHARED_DIR through a Ray job from the head's trainer
(polarstack.checks.shared_probe) before anything writes to it, reads the weight_version of every engine of every node
by its cluster address, and judges weight_sync on all of them: an engine of node 1 the weights never reached fails
the class, naming it; a node that does not share SHARED_DIR stops the rehearsal (REHEARSAL_FAILED) naming that node,
and the stack still goes down. Node.join itself: it polls until the last node's report is in, then checks the nodes;
it gives up after its timeout with one sentence naming the node and the command to run there."""

import json
import re

import pytest

from polarstack.checks import nodes, sandbox_probe
from polarstack.errors import ExitCode, StackError
from polarstack.stack import assets, docker_state, profiles
from polarstack.stack.cluster import Cluster
from polarstack.stack.resolved import read_now
from polarstack.train import cluster_plan, preflight, rehearsal_run
from rehearsal_fakes import FakeNode

pytestmark = pytest.mark.unit
ADDRS = ("10.0.0.1", "10.0.0.2")
CLUSTER = Cluster(2, 0, "ens1f0", ADDRS, "", "/mnt/shared")
ENGINES = [f"http://{a}:{p}" for a in ADDRS for p in (30000, 30010)]


class TwoNodes(FakeNode):
    def __init__(self, host_dir, *, stale_engine=None, probe=None):
        super().__init__(host_dir)
        self.stale_engine, self.probe = stale_engine, probe
        self.joined, self.probe_commands, self.order = 0, [], []

    def open_session(self, plan, progress):
        self.order.append(("session", list(self.compose_calls)))

    def join(self, plan, progress):
        self.joined += 1

    def trainer(self, command):
        if "/model_info" in command:
            urls = re.findall(r"http://[\d.]+:\d+", command)
            return 0, json.dumps(
                {u: ("default" if u == self.stale_engine or not self.version else str(self.version)) for u in urls}
            )
        if "polarstack.checks.shared_probe" in command:
            self.probe_commands.append(command)
            nodes_seen = self.probe or {a: {"read": True, "wrote": True} for a in ADDRS}
            return 0, "Job submitted\n" + json.dumps({"nonce_sha256": "0" * 64, "nodes": nodes_seen}) + "\nsucceeded\n"
        return super().trainer(command)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(assets, "check_before_up", lambda profile, *, cpu: None)
    monkeypatch.setattr(sandbox_probe, "check_in_trainer", lambda profile, where: None)
    for key in ("MODEL_PATH", "MODEL_NAME", "SERVED_MODEL_NAME"):
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    profile = profiles.load("patched-router")
    plan = preflight.build(profile, run_id="preflight-mn", cluster=CLUSTER)
    return profile, plan, tmp_path / "run" / "train" / "preflight-mn"


def test_a_2_node_rehearsal_joins_proves_the_shared_dir_and_reads_every_engine(setup):
    profile, plan, host = setup
    node = TwoNodes(host)
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert result["passed"], result
    assert node.joined == 1 and node.compose_calls == ["up", "down"]
    assert node.order == [("session", [])]  # the session and the other nodes' line before the head's `up`
    (probe,) = node.probe_commands
    assert "ray job submit --address=http://10.0.0.1:8265 -- python3 -m polarstack.checks.shared_probe" in probe
    assert "--dir /mnt/shared/nodes/probe-preflight-mn" in probe
    saved = json.loads((host / "rehearsal-report.json").read_text())
    assert sorted(saved["evidence"]["weight_versions"]["before"]) == ENGINES
    assert saved["evidence"]["engines"] == ENGINES
    verdict = next(c for c in saved["verdicts"] if c["class"] == "weight_sync")
    assert verdict["verdict"] == "pass" and all(e in verdict["figure"] for e in ENGINES)
    assert saved["evidence"]["shared_dir"]["nodes"]["10.0.0.2"] == {"read": True, "wrote": True}


def test_an_engine_of_node_1_the_weights_never_reached_fails_weight_sync(setup):
    profile, plan, host = setup
    result = rehearsal_run.run(
        profile, plan, read_now(), node=TwoNodes(host, stale_engine=ENGINES[3]), progress=lambda m: None
    )
    verdict = next(c for c in result["verdicts"] if c["class"] == "weight_sync")
    assert not result["passed"] and verdict["verdict"] == "fail"
    assert verdict["change"].startswith(f"weights did not reach {ENGINES[3]} ")


def test_a_node_that_does_not_share_the_directory_stops_the_rehearsal(setup):
    profile, plan, host = setup
    seen = {"10.0.0.1": {"read": True, "wrote": True}, "10.0.0.2": {"read": False, "wrote": True}}
    node = TwoNodes(host, probe=seen)
    with pytest.raises(StackError) as caught:
        rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert caught.value.code == ExitCode.REHEARSAL_FAILED
    assert "node 1 (10.0.0.2) does not see the head's file in SHARED_DIR" in caught.value.message
    assert node.jobs == 0 and node.compose_calls == ["up", "down"] and docker_state.read(cpu=False) is None


def test_join_waits_for_the_last_node_then_checks_them(setup, monkeypatch):
    profile, plan, _ = setup
    waiting = [[1], [1], []]
    calls = []
    monkeypatch.setattr(
        nodes, "write_report", lambda c, p, values, probe=None, *, cpu: calls.append(("report", c.rank))
    )
    monkeypatch.setattr(nodes, "pending", lambda c: waiting.pop(0))
    monkeypatch.setattr(rehearsal_run.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(cluster_plan, "require_nodes", lambda *a, **kw: calls.append(("check", a[1].nodes)))
    messages = []
    rehearsal_run.Node(profile, read_now()).join(plan, messages.append)
    assert calls == [("report", 0), ("sleep", 10), ("sleep", 10), ("check", 2)]
    assert "MODEL_PATH=/models/Qwen2.5-3B-Instruct" in messages[0] and "node 1 (10.0.0.2)" in messages[0]


def test_join_gives_up_naming_the_node_and_the_command(setup, monkeypatch):
    profile, plan, _ = setup
    monkeypatch.setattr(nodes, "write_report", lambda *a, **kw: None)
    monkeypatch.setattr(nodes, "pending", lambda c: [1])
    monkeypatch.setattr(rehearsal_run, "JOIN_TIMEOUT_SECONDS", -1)
    with pytest.raises(StackError) as caught:
        rehearsal_run.Node(profile, read_now()).join(plan, lambda m: None)
    assert caught.value.code == ExitCode.STATE
    assert caught.value.message.startswith("node(s) 10.0.0.2 did not come up within")
    assert "make up PROFILE=patched-router MODEL_NAME=Qwen/Qwen2.5-3B-Instruct" in caught.value.message


def test_the_session_is_opened_and_the_other_nodes_asked_before_the_heads_up(setup, monkeypatch):
    """The node review: with router-passthrough the head's `up` waits for the other node's engines, so the line that
    asks for their `make up` must come before it, with the session their reports go into."""
    profile, plan, _ = setup
    opened = []
    monkeypatch.setattr(nodes, "start_session", lambda c, probe=None: opened.append(c.rank))
    messages = []
    rehearsal_run.Node(profile, read_now()).open_session(plan, messages.append)
    assert opened == [0]
    assert messages[0].startswith("now run `make up PROFILE=patched-router MODEL_NAME=Qwen/Qwen2.5-3B-Instruct")
    assert "node 1 (10.0.0.2)" in messages[0]
