"""Pins the node checks before anything long (issue 28 point 6, polarstack.checks.nodes): with fake node reports in a
temporary SHARED_DIR and a fake probe (Ray's state API, TCP connects, the engines' Date headers), every refusal ends
with its one sentence naming the node and the field, and its exit code: a missing or stale report (STATE), a pin that
differs (STATE), a node not joined or offering other GPUs (STATE), a token the head refuses (STATE), a port that does
not connect (UNREACHABLE), a clock beyond the bound (ENVIRONMENT), too few GPUs or too little memory (ENVIRONMENT).
The report a node writes carries no secret."""

from __future__ import annotations

import dataclasses
import email.utils
import json

import httpx
import pytest

from polarstack.checks import nodes
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.stack import profiles
from polarstack.stack.cluster import Cluster

pytestmark = pytest.mark.unit
ADDRS = ("10.0.0.1", "10.0.0.2")
NOW = 1_800_000_000.0


class FakeProbe(nodes.Probe):
    def __init__(self, *, skew: float = 0.0, refuse: str | None = None, ray_nodes=None, status: int = 200):
        self.skew, self.refuse, self.status = skew, refuse, status
        self.ray_nodes = ray_nodes
        self.gets: list[str] = []

    def now(self) -> float:
        return NOW

    def image_id(self, image: str) -> str | None:
        return "sha256:" + image.split(":")[0].replace("/", "-")

    def model_fingerprint(self, profile, model_path: str, where) -> str | None:
        return "model-fp-1"

    def gpus(self):
        return [{"index": i, "memory_mib": 140e9 / 1024**2} for i in range(4)]

    def host_memory_kib(self):
        return 2e12 / 1024

    def get(self, url, headers=None, timeout=10.0):
        self.gets.append(url)
        request = httpx.Request("GET", url)
        if url.endswith("/api/v0/nodes"):
            assert headers and headers["Authorization"].startswith("Bearer ")
            rows = (
                self.ray_nodes
                if self.ray_nodes is not None
                else [{"node_ip": a, "state": "ALIVE", "resources_total": {"GPU": 2.0}} for a in ADDRS]
            )
            return httpx.Response(self.status, json={"data": {"result": {"result": rows}}}, request=request)
        date = email.utils.formatdate(NOW + self.skew, usegmt=True)
        return httpx.Response(200, text="ok", headers={"date": date}, request=request)

    def connect(self, host, port):
        if self.refuse == f"{host}:{port}":
            raise ConnectionRefusedError(111, "Connection refused")


@pytest.fixture
def cluster(tmp_path):
    token = tmp_path / "token"
    token.write_text("ab" * 32 + "\n")
    token.chmod(0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    return Cluster(2, 0, "ens1f0", ADDRS, str(token), str(shared))


@pytest.fixture
def profile():
    return profiles.load("patched-router")


VALUES = {"SGLANG_VERSION": "0.5.15.post1", "SLIME_COMMIT": "abc", "MODEL_PATH": "/models/m"}
NEED = nodes.Need(gpu_count=4, trainer_gpus=(2, 3), engine_gpus=(0, 1), trainer_gpu_gb=90, engine_gpu_gb=30, host_gb=60)


def rank(cluster: Cluster, r: int) -> Cluster:
    return Cluster(cluster.nodes, r, cluster.iface, cluster.addrs, cluster.token_file, cluster.shared_dir)


def head_up(cluster, profile, probe=None):
    """The head's `make up`: the session before anything starts (train.cluster_up.open_session), its report after."""
    probe = probe or FakeProbe()
    nodes.start_session(cluster, probe)
    nodes.write_report(cluster, profile, VALUES, probe, cpu=False)


def bring_up(cluster, profile, probe=None):
    """What `make up` writes on the head, then on node 1."""
    probe = probe or FakeProbe()
    head_up(cluster, profile, probe)
    nodes.write_report(rank(cluster, 1), profile, VALUES, probe, cpu=False)


def run_check(cluster, profile, probe=None, need=NEED):
    return nodes.check(cluster, profile, need=need, dashboard_port=8265, probe=probe or FakeProbe())


def edit(cluster, r, change):
    path = nodes.report_path(cluster, r)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def refused(cluster, profile, probe=None, need=NEED) -> StackError:
    with pytest.raises(StackError) as caught:
        run_check(cluster, profile, probe, need)
    return caught.value


def test_every_node_up_alike_passes(cluster, profile):
    bring_up(cluster, profile)
    assert nodes.pending(cluster) == []
    report = run_check(cluster, profile)
    assert report.ok and [r.addr for r in report.rows] == list(ADDRS)
    assert report.rows[1].ports == ["10.0.0.2:30000", "10.0.0.2:30010"]
    assert report.rows[0].ports[0] == "10.0.0.1:30080"  # the router on the head
    assert all(r.clock_skew_seconds == 0.0 and r.ray == "alive, 2 GPU" for r in report.rows)


def test_the_report_holds_no_secret(cluster, profile):
    bring_up(cluster, profile)
    token = (cluster.token_file and open(cluster.token_file).read().strip()) or ""
    for r in (0, 1):
        text = nodes.report_path(cluster, r).read_text()
        assert token not in text and "token" not in text.lower()


def test_a_missing_report_names_the_node(cluster, profile):
    head_up(cluster, profile)
    assert nodes.pending(cluster) == [1]
    error = refused(cluster, profile)
    assert error.code == ExitCode.STATE
    assert error.message.startswith("node 1 (10.0.0.2) has written no report") and "NODE_RANK=1" in error.message


def test_a_report_of_an_earlier_session_is_stale(cluster, profile):
    bring_up(cluster, profile)
    head_up(cluster, profile)  # the head came up again; node 1 did not
    assert nodes.pending(cluster) == [1]
    error = refused(cluster, profile)
    assert error.code == ExitCode.STATE and "node 1 (10.0.0.2)'s report" in error.message and "stale" in error.message


def test_a_node_whose_make_up_ends_before_the_heads_reports_into_its_session(cluster, profile):
    """The review's finding: both nodes' `make up` run at once and node 1's ends first. The head opened the session
    before it started anything, so node 1's report is of the current session, not refused or stale."""
    nodes.start_session(cluster, FakeProbe())  # the head's before_up
    nodes.write_report(rank(cluster, 1), profile, VALUES, FakeProbe(), cpu=False)
    assert nodes.pending(cluster) == [0]
    nodes.write_report(cluster, profile, VALUES, FakeProbe(), cpu=False)  # the head's after_up
    assert nodes.pending(cluster) == [] and run_check(cluster, profile).ok


def test_a_node_cannot_join_before_the_head(cluster, profile):
    with pytest.raises(StackError) as caught:
        nodes.write_report(rank(cluster, 1), profile, VALUES, FakeProbe(), cpu=False)
    assert caught.value.code == ExitCode.STATE and "run `make up` on the head (10.0.0.1" in caught.value.message


@pytest.mark.parametrize(
    "field, change",
    [
        ("pins_sha256", lambda d: d.update(pins_sha256="0" * 64)),
        ("pins.SLIME_COMMIT", lambda d: d["pins"].update(SLIME_COMMIT="other")),
        ("pins.POLAR_COMMIT", lambda d: d["pins"].update(POLAR_COMMIT="other")),
        ("images.trainer", lambda d: d["images"].update(trainer="sha256:other")),
        ("images.engine", lambda d: d["images"].update(engine=None)),
        ("model", lambda d: d.update(model="model-fp-2")),
        ("profile", lambda d: d.update(profile="router-passthrough")),
    ],
)
def test_a_pin_that_differs_names_the_node_and_the_field(cluster, profile, field, change):
    bring_up(cluster, profile)
    edit(cluster, 1, change)
    error = refused(cluster, profile)
    assert error.code == ExitCode.STATE
    assert error.message.startswith(f"node 1 (10.0.0.2) differs from the head in {field} ")


def test_a_report_under_another_address_names_the_config(cluster, profile):
    bring_up(cluster, profile)
    edit(cluster, 1, lambda d: d.update(addr="10.0.0.9"))
    error = refused(cluster, profile)
    assert error.code == ExitCode.STATE and "NODE_ADDRS[1] is 10.0.0.2" in error.message


def test_a_node_that_did_not_join_ray(cluster, profile):
    bring_up(cluster, profile)
    probe = FakeProbe(ray_nodes=[{"node_ip": "10.0.0.1", "state": "ALIVE", "resources_total": {"GPU": 2.0}}])
    error = refused(cluster, profile, probe)
    assert error.code == ExitCode.STATE and error.message.startswith("node 1 (10.0.0.2) is not an alive node")


def test_a_node_offering_other_gpus_to_ray(cluster, profile):
    bring_up(cluster, profile)
    rows = [{"node_ip": a, "state": "ALIVE", "resources_total": {"GPU": 2.0 if a == ADDRS[0] else 4.0}} for a in ADDRS]
    error = refused(cluster, profile, FakeProbe(ray_nodes=rows))
    assert error.code == ExitCode.STATE and "node 1 (10.0.0.2) offers Ray 4 GPU(s)" in error.message


def test_a_token_the_head_refuses(cluster, profile):
    bring_up(cluster, profile)
    error = refused(cluster, profile, FakeProbe(status=401))
    assert error.code == ExitCode.STATE and "refused this node's token (401)" in error.message


def test_a_port_that_does_not_connect_names_node_and_port(cluster, profile):
    bring_up(cluster, profile)
    error = refused(cluster, profile, FakeProbe(refuse="10.0.0.2:30010"))
    assert error.code == ExitCode.UNREACHABLE
    assert error.message.startswith("node 1 (10.0.0.2) does not accept a connection on 10.0.0.2:30010")


@pytest.mark.parametrize("skew, ok", [(4.0, True), (-4.0, True), (7.0, False), (-30.0, False)])
def test_clock_bound(cluster, profile, skew, ok):
    bring_up(cluster, profile)
    probe = FakeProbe(skew=skew)
    if ok:
        assert run_check(cluster, profile, probe).rows[1].clock_skew_seconds == skew
        return
    error = refused(cluster, profile, probe)
    assert error.code == ExitCode.ENVIRONMENT
    assert f"clock is {skew:+.0f} s from this node's (bound {nodes.CLOCK_BOUND_SECONDS:g} s)" in error.message


def test_too_few_gpus_or_memory_per_node(cluster, profile):
    bring_up(cluster, profile)
    edit(cluster, 1, lambda d: d.update(gpus=d["gpus"][:2]))
    error = refused(cluster, profile)
    assert error.code == ExitCode.ENVIRONMENT and error.message.startswith("node 1 (10.0.0.2) has 2 GPU(s)")
    bring_up(cluster, profile)
    small = dataclasses.replace(NEED, trainer_gpu_gb=150.0)
    error = refused(cluster, profile, need=small)
    assert error.code == ExitCode.ENVIRONMENT and "trainer GPUs have 140.0 GB, the plan needs 150.0 GB" in error.message
    edit(cluster, 1, lambda d: d.update(host_memory_kib=50e9 / 1024))
    error = refused(cluster, profile)
    assert error.code == ExitCode.ENVIRONMENT and "node 1 (10.0.0.2) has 50.0 GB of host memory" in error.message


def test_one_node_has_nothing_to_compare(capsys, monkeypatch):
    monkeypatch.delenv("NODES", raising=False)
    assert main(["cluster", "check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 1


def test_the_cli_reports_the_failure_as_json_and_its_code(cluster, profile, monkeypatch, capsys):
    head_up(cluster, profile)
    for key, value in {
        "NODES": "2",
        "NODE_RANK": "0",
        "CLUSTER_IFACE": "ens1f0",
        "NODE_ADDRS": ",".join(ADDRS),
        "SHARED_DIR": cluster.shared_dir,
        "RAY_AUTH_TOKEN_FILE": cluster.token_file,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(cluster.shared_dir) + "-run")
    code = main(["cluster", "check", "--profile", "patched-router", "--json"])
    out, err = capsys.readouterr()
    assert code == ExitCode.STATE
    report = json.loads(out)
    assert report["ok"] is False and report["exit_code"] == ExitCode.STATE
    assert report["message"].startswith("node 1 (10.0.0.2) has written no report")
    assert err.strip().startswith("polarstack: node 1 (10.0.0.2) has written no report")


def test_a_nodes_host_memory_is_what_it_has_available(tmp_path, monkeypatch):
    """Issue 32 point 8: every node's report carries MemAvailable, as polarstack.train.memory checks this node."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000000 kB\nMemFree:         10000 kB\nMemAvailable:    400000 kB\n")
    monkeypatch.setenv("POLARSTACK_PROC_MEMINFO", str(meminfo))
    assert nodes.Probe().host_memory_kib() == 400000
