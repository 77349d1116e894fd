"""Pins verify-offline's 2-node check (issue 28 acceptance, polarstack.offline.multinode): the committed plan and
Compose overrides pass, and each way the multi-node plan could silently break a recorded fact is caught with a
sentence naming it: a job-wide SLIME_HOST_IP, the loopback switch RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, an engine by a
loopback address, a weight-sync directory off SHARED_DIR, actor nodes that do not match, a worker node that offers
Ray more CPUs than trainer GPUs, the token not mounted; a recorded line that stopped saying what the plan assumes,
and a measurement that changed."""

import copy

import pytest

from polarstack.offline import multinode
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import compose, profiles
from polarstack.train import cluster_plan
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit
EXAMPLE = multinode.EXAMPLE


def problems_of(profile_name="patched-router"):
    profile = profiles.load(profile_name)
    plan = build_plan("humaneval", profile, run_id="t", cluster=EXAMPLE)
    return multinode.plan_problems(plan, profile, EXAMPLE, "t")


def test_the_committed_multi_node_plan_passes():
    checks = multinode.check(cpu=False)
    assert [c.name for c in checks if not c.ok] == []
    assert len(checks) == 4  # the facts, the two working router profiles, the refusals


def test_a_job_wide_slime_host_ip_is_caught(monkeypatch):
    real = cluster_plan.job_env
    monkeypatch.setattr(cluster_plan, "job_env", lambda c: {**real(c), "SLIME_HOST_IP": c.head_addr})
    assert any("the Ray job sets SLIME_HOST_IP=192.0.2.10 for every node" in p for p in problems_of())


def test_polar_on_the_cluster_network_is_caught(monkeypatch):
    """Polar's rollout server and gateway stay on the head's 127.0.0.1 (their routes are mostly unauthenticated)."""
    monkeypatch.setattr(cluster_plan, "polar_host", lambda c: c.head_addr)
    assert any("Polar's topology.yaml must keep its servers on the head's 127.0.0.1" in p for p in problems_of())


def test_the_loopback_switch_is_caught(monkeypatch):
    real = cluster_plan.launch_env
    monkeypatch.setattr(cluster_plan, "launch_env", lambda c: {**real(c), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert any(
        "launch.sh sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which aborts every join" in p for p in problems_of()
    )


def test_engines_by_loopback_address_are_caught(monkeypatch):
    monkeypatch.setattr(
        cluster_mod, "engine_urls", lambda profile, c: ["http://127.0.0.1:30000", "http://127.0.0.1:30010"] * 2
    )
    assert any(
        "an engine is named by a loopback or wildcard address another node cannot reach" in p for p in problems_of()
    )


def test_a_weight_dir_off_the_shared_dir_is_caught(monkeypatch):
    monkeypatch.setattr(cluster_plan, "weight_update_dir", lambda c, d: "/shared/weight-updates")
    assert any("the disk weight sync is not under SHARED_DIR=/mnt/shared" in p for p in problems_of())


def test_actor_nodes_that_do_not_match_are_caught():
    profile = profiles.load("patched-router")
    plan = build_plan("humaneval", profile, run_id="t", cluster=EXAMPLE)
    i = plan.train_args.index("--actor-num-nodes")
    plan.train_args[i + 1] = "1"
    assert any(
        "--actor-num-nodes 1 x --actor-num-gpus-per-node 2 is not 2 nodes" in p
        for p in multinode.plan_problems(plan, profile, EXAMPLE, "t")
    )


def test_a_worker_without_one_cpu_per_gpu_is_caught(monkeypatch):
    real = compose.cluster_override

    def without_cpus(profile, cluster):
        out = real(profile, cluster)
        out["services"]["trainer"]["command"] = [
            w for w in out["services"]["trainer"]["command"] if "--num-cpus" not in w
        ]
        return out

    monkeypatch.setattr(compose, "cluster_override", without_cpus)
    found = multinode.override_problems(profiles.load("patched-router"), EXAMPLE, cpu=False)
    assert any("node 1 (192.0.2.11)" in p and "--num-cpus=2" in p for p in found)


def test_the_token_not_mounted_is_caught(monkeypatch):
    real = compose.cluster_override

    def no_token(profile, cluster):
        out = real(profile, cluster)
        trainer = out["services"]["trainer"]
        trainer["volumes"] = [v for v in trainer["volumes"] if "ray-auth-token" not in str(v)]
        return out

    monkeypatch.setattr(compose, "cluster_override", no_token)
    found = multinode.override_problems(profiles.load("router-passthrough"), EXAMPLE, cpu=False)
    assert any("the host's token file is not mounted read-only" in p for p in found)


def test_a_token_mount_that_would_create_a_directory_is_caught(monkeypatch):
    real = compose.cluster_override

    def short_syntax(profile, cluster):
        out = real(profile, cluster)
        trainer = out["services"]["trainer"]
        trainer["volumes"] = [
            f"{v['source']}:{v['target']}:ro" if isinstance(v, dict) else v for v in trainer["volumes"]
        ]  # the short form: Compose creates a missing source as a directory
        return out

    monkeypatch.setattr(compose, "cluster_override", short_syntax)
    found = multinode.override_problems(profiles.load("router-passthrough"), EXAMPLE, cpu=False)
    assert any("the host's token file is not mounted read-only" in p for p in found)


def test_a_recorded_line_that_changed_is_caught():
    data = copy.deepcopy(multinode.record())
    data["slime"]["bundle_per_gpu"]["found"][0]["text"] = 'bundles = [{"GPU": 1} for _ in range(num_gpus)]'
    found = multinode.fact_problems(data)
    assert found == [
        f'{multinode.RECORD} slime.bundle_per_gpu no longer says \'{{"GPU": 1, "CPU": 1}}\' (each bundle takes one '
        "GPU and one CPU); reread the source"
    ]


def test_a_measurement_that_changed_is_caught():
    data = copy.deepcopy(multinode.record())
    data["ray_token_measured"]["routes"]["dashboard /api/gcs_healthz"]["without_token"] = 401
    assert any("/api/gcs_healthz answered" in p for p in multinode.fact_problems(data))
    data = copy.deepcopy(multinode.record())
    data["tcpstore_measured"]["torch"] = "2.9.1"
    assert any("not the 2.11.0 sglang requires" in p for p in multinode.fact_problems(data))


def _override_without(monkeypatch, change):
    real = compose.cluster_override

    def changed(profile, cluster):
        out = real(profile, cluster)
        change(out["services"], cluster)
        return out

    monkeypatch.setattr(compose, "cluster_override", changed)
    return multinode.override_problems(profiles.load("router-passthrough"), EXAMPLE, cpu=False)


def test_a_head_ray_that_waits_for_the_static_router_is_caught(monkeypatch):
    """The node review's blocker: compose.yaml's trainer waits for a healthy router, which at NODES>1 waits for the
    other nodes' engines, whose trainers join the head's Ray."""
    found = _override_without(monkeypatch, lambda s, c: s["trainer"].pop("depends_on", None) if c.head else None)
    assert any("the head's Ray waits for a router that waits for the other nodes" in p for p in found)


def test_a_static_router_without_time_for_the_other_nodes_is_caught(monkeypatch):
    found = _override_without(
        monkeypatch, lambda s, c: s["router"]["healthcheck"].pop("start_period") if c.head else None
    )
    assert any("gives the other nodes' engines no time to load" in p for p in found)
    monkeypatch.setattr(compose, "static_wait_args", lambda *a: [])
    found = multinode.override_problems(profiles.load("router-passthrough"), EXAMPLE, cpu=False)
    assert any("waits its default s for the other nodes' engines" in p for p in found)


def test_a_worker_healthcheck_without_time_to_join_is_caught(monkeypatch):
    found = _override_without(
        monkeypatch, lambda s, c: None if c.head else s["trainer"]["healthcheck"].pop("start_period")
    )
    assert any("the worker's healthcheck gives its join to the head no time" in p for p in found)


def test_a_wait_flag_the_pinned_router_does_not_take_is_caught(monkeypatch):
    monkeypatch.setattr(compose, "static_wait_args", lambda *a: ["--worker-startup-timeout-secs", "900", "--no-such"])
    found = multinode.override_problems(profiles.load("router-passthrough"), EXAMPLE, cpu=False)
    assert any("--no-such" in p for p in found)
