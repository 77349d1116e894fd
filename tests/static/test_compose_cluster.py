"""Pins what `make up` renders on each node of a 2-node cluster (issue 28 point 4): the real Compose v2 binary merges
compose.yaml with the rendered .cluster.yaml of rank 0 and of rank 1, and the merged model says: every engine binds
its node's address and is healthchecked there; the router runs on the head only, bound to the head's address, with
every node's engines as static workers; the head's trainer runs `ray start --head` on the head's address and rank 1's
joins it with its own address and one CPU per trainer GPU; RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is 1, SLIME_HOST_IP the
node's own, NCCL/GLOO the cluster interface, Ray's token is the host's file mounted read-only by path (its content
appears nowhere); SHARED_DIR is mounted at its own path in trainer and engines; nothing binds 0.0.0.0. One node
renders no cluster file, and a cluster file left by an earlier 2-node rendering is removed."""

import json
import subprocess
from pathlib import Path

import pytest

from polarstack import paths
from polarstack.stack import compose, profiles, ray_auth
from polarstack.stack.cluster import Cluster

pytestmark = pytest.mark.static
ADDRS = ("192.0.2.10", "192.0.2.11")
TOKEN = "cd" * 32


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secrets") / "ray-auth-token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def node(rank: int, token_file: Path, shared: str = "/mnt/shared") -> Cluster:
    return Cluster(2, rank, "ens1f0", ADDRS, str(token_file), shared)


def merged(profile_name: str, cluster: Cluster, tmp_path: Path) -> dict:
    profile = profiles.load(profile_name)
    args = compose.compose_args(profile, tmp_path, cluster=cluster, cpu=False)
    proc = subprocess.run(
        [str(compose.bundled_compose()), *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def env(service: dict) -> dict:
    return service.get("environment") or {}


def mounts(service: dict) -> list[tuple]:
    return [(v.get("source"), v.get("target"), bool(v.get("read_only"))) for v in service.get("volumes") or []]


@pytest.mark.parametrize("name", ["router-passthrough", "patched-router"])
@pytest.mark.parametrize("rank", [0, 1])
def test_each_node_renders_its_part(name, rank, tmp_path, token_file):
    model = merged(name, node(rank, token_file), tmp_path)
    services = model["services"]
    addr, head = ADDRS[rank], ADDRS[0]
    assert ("router" in services) == (rank == 0)
    for engine in ("engine-0", "engine-1"):
        svc = services[engine]
        command = svc["command"]
        assert command[command.index("--host") + 1] == addr
        assert svc["healthcheck"]["test"][-1].startswith(f"http://{addr}:")
        assert env(svc)["NCCL_SOCKET_IFNAME"] == env(svc)["GLOO_SOCKET_IFNAME"] == "ens1f0"
        assert ("/mnt/shared", "/mnt/shared", False) in mounts(svc)
    trainer = services["trainer"]
    command = trainer["command"]
    if rank == 0:
        assert command[:4] == ["ray", "start", "--head", "--block"]
        assert f"--node-ip-address={head}" in command and f"--dashboard-host={head}" in command
        assert trainer["healthcheck"]["test"][-1] == f"http://{head}:8265/api/gcs_healthz"
        router = services["router"]
        assert env(router)["ROUTER_HOST"] == head
        assert router["healthcheck"]["test"][-1] == f"http://{head}:30080/health"
        workers = env(router)["ROUTER_WORKER_URLS"].split()
        if name == "router-passthrough":
            assert workers == [f"http://{a}:{p}" for a in ADDRS for p in (30000, 30010)]
        else:
            assert workers == []  # slime registers them (POST /workers), by the addresses of the plan
    else:
        assert command[:3] == ["ray", "start", f"--address={head}:6379"]
        assert f"--node-ip-address={addr}" in command and "--num-cpus=2" in command and "--num-gpus=2" in command
        assert trainer["healthcheck"]["test"][-1] == f"http://{addr}:52365/api/local_raylet_healthz"
    e = env(trainer)
    assert e["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and e["SLIME_HOST_IP"] == addr
    assert e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert {k: e[k] for k in ray_auth.MODE_ENV} == ray_auth.MODE_ENV
    assert e["RAY_AUTH_TOKEN_PATH"] == ray_auth.CONTAINER_TOKEN_PATH
    assert (str(token_file), ray_auth.CONTAINER_TOKEN_PATH, True) in mounts(trainer)
    assert ("/mnt/shared", "/mnt/shared", False) in mounts(trainer)
    assert e["ENGINE_URLS"].split() == [f"http://{a}:{p}" for a in ADDRS for p in (30000, 30010)]
    assert e["SGLANG_ROUTER_BASE_URL"] == f"http://{head}:30080"
    text = json.dumps(model)
    assert TOKEN not in text and "0.0.0.0" not in text
    assert TOKEN not in "".join(p.read_text() for p in tmp_path.iterdir() if p.is_file())


def test_one_node_renders_no_cluster_file_and_removes_a_stale_one(tmp_path, token_file):
    profile = profiles.load("patched-router")
    compose.compose_args(profile, tmp_path, cluster=node(0, token_file), cpu=False)
    stale = compose.cluster_file(profile, tmp_path)
    assert stale.is_file()
    one = Cluster(1, 0, None, ("127.0.0.1",), "", "")
    args = compose.compose_args(profile, tmp_path, cluster=one, cpu=False)
    assert not stale.exists() and not any(a.endswith(".cluster.yaml") for a in args)
    model = merged("patched-router", one, tmp_path)
    trainer = model["services"]["trainer"]
    assert env(trainer)["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and env(trainer)["SLIME_HOST_IP"] == "127.0.0.1"


@pytest.mark.parametrize("host, want", [(None, "127.0.0.1"), ("192.0.2.10", "192.0.2.10")])
def test_the_router_entrypoint_binds_router_host_else_loopback(tmp_path, host, want):
    """images/router/entrypoint.sh run by sh with a stand-in `python` that prints its arguments."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    script = paths.compose_file().parents[1] / "images" / "router" / "entrypoint.sh"
    environment = {"PATH": f"{tmp_path}:/usr/bin:/bin", "ROUTER_MODULE": "smg.launch_router", "ROUTER_PORT": "30080"}
    if host:
        environment["ROUTER_HOST"] = host
    proc = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=environment)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split("\n")[-2].split()
    assert words[:6] == ["-m", "smg.launch_router", "--host", want, "--port", "30080"]


@pytest.mark.parametrize("name", ["router-passthrough", "patched-router"])
def test_the_heads_ray_never_waits_for_a_router_that_waits_for_the_other_node(name, tmp_path, token_file):
    """The node review's blocker: with a static worker list (router-passthrough) the head's router opens no port until
    every node's engines answer (sglang-router 0.1.4 waits up to --worker-startup-timeout-secs), and compose.yaml made
    the head's trainer (the Ray head) wait for a healthy router, so rank 1's trainer, which joins that Ray, could not
    start: neither node could finish. Merged by the real Compose binary: on the head the trainer waits for its own
    engines only, the router waits as long as an engine may load (ENGINE_START_PERIOD) and its healthcheck has that
    start period. With registration (patched-router) the router starts empty, and nothing changes."""
    services = merged(name, node(0, token_file), tmp_path)["services"]
    depends = set(services["trainer"].get("depends_on") or {})
    router = services["router"]
    extra = env(router)["ROUTER_EXTRA_ARGS"].split()
    if name == "router-passthrough":
        assert depends == {"engine-0", "engine-1"}
        assert extra[extra.index("--worker-startup-timeout-secs") + 1] == "900"
        assert router["healthcheck"]["start_period"] == "15m0s"
    else:
        assert "router" in depends and "--worker-startup-timeout-secs" not in extra
        assert router["healthcheck"]["start_period"] == "30s"
    one = Cluster(1, 0, None, ("127.0.0.1",), str(token_file), "")
    one_node = compose.render_values(profiles.load(name), one, cpu=False)
    assert "--worker-startup-timeout-secs" not in one_node["ROUTER_EXTRA_ARGS"]


@pytest.mark.parametrize("text, seconds", [("900s", 900), ("15m", 900), ("1h30m", 5400), ("2m5s", 125)])
def test_compose_durations_in_seconds(text, seconds):
    assert compose.seconds(text) == seconds


def test_a_duration_that_is_not_one_is_refused():
    from polarstack.errors import ExitCode, StackError

    with pytest.raises(StackError) as caught:
        compose.seconds("fifteen minutes")
    assert caught.value.code == ExitCode.USAGE and "ENGINE_START_PERIOD" in caught.value.message


def test_a_workers_trainer_may_wait_for_the_head_as_long_as_an_engine_may_load(tmp_path, token_file):
    """The second review: rank 1's trainer is healthy once its raylet joined the head's Ray, which can come as late
    as the head's engines take to load; compose.yaml's 120 s start period would mark it unhealthy first."""
    worker = merged("patched-router", node(1, token_file), tmp_path / "w")["services"]["trainer"]
    head = merged("patched-router", node(0, token_file), tmp_path / "h")["services"]["trainer"]
    assert worker["healthcheck"]["start_period"] == "15m0s"
    assert head["healthcheck"]["start_period"] == "2m0s"  # the head's Ray starts with its own engines
