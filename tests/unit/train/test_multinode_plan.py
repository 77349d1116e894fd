"""Pins the 2-node plan (issue 28 points 1, 3 and 5): `make train DRY_RUN=1` and `make preflight DRY_RUN=1` run
in-process with NODES=2 in the environment render actor nodes x GPUs per node, every node's engines by cluster
address, the router, Polar and the Ray head on the head's address, NCCL/GLOO on CLUSTER_IFACE, SLIME_HOST_IP per node
(never job-wide), no RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, Ray's token by path, the weight sync and checkpoints on
SHARED_DIR, and the memory model per node (DP doubles; only the optimizer term per GPU and the offloaded host terms
shrink). The refusals: engine-direct, no SHARED_DIR, model.save off the shared tree, a batch that breaks at DP 4."""

import json
import shlex

import pytest
import yaml

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.stack import ray_auth

pytestmark = pytest.mark.unit
ADDRS = ("10.0.0.1", "10.0.0.2")


@pytest.fixture
def two_nodes(monkeypatch, tmp_path):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    values = {
        "NODES": "2",
        "NODE_RANK": "0",
        "CLUSTER_IFACE": "ens1f0",
        "NODE_ADDRS": ",".join(ADDRS),
        "SHARED_DIR": "/mnt/shared",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def plan(capsys, *extra, command="train"):
    args = ["train", "--task", "humaneval"] if command == "train" else ["preflight"]
    code = main([*args, "--dry-run", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def submitted(p):
    return next(c for c in p["commands"] if c.startswith("ray job submit"))


def job_env(p):
    words = shlex.split(submitted(p))
    return json.loads(next(w for w in words if w.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]


def train_args(p):
    words = shlex.split(submitted(p))
    return words[words.index("/root/slime/train_async.py") + 1 :]


def value(args, flag):
    return args[args.index(flag) + 1]


def exports(p):
    out = {}
    for line in p["files"]["launch.sh"].splitlines():
        if line.startswith("export "):
            key, val = line.removeprefix("export ").split("=", 1)
            out[key] = shlex.split(val)[0]
    return out


@pytest.mark.parametrize("profile", ["patched-router", "router-passthrough"])
def test_two_nodes_render_the_cluster_plan(two_nodes, capsys, profile):
    p = plan(capsys, "--profile", profile)
    args = train_args(p)
    assert value(args, "--actor-num-nodes") == "2" and value(args, "--actor-num-gpus-per-node") == "2"
    start = args.index("--rollout-external-engine-addrs") + 1
    assert args[start : start + 4] == ["10.0.0.1:30000", "10.0.0.1:30010", "10.0.0.2:30000", "10.0.0.2:30010"]
    assert args[start + 4].startswith("--")
    if profile == "patched-router":
        assert value(args, "--sglang-router-ip") == "10.0.0.1"
    else:
        assert "--sglang-router-ip" not in args
    head = p["commands"][0]
    assert "--node-ip-address=10.0.0.1" in head and "--dashboard-host=10.0.0.1" in head
    assert submitted(p).startswith("ray job submit --address=http://10.0.0.1:8265 ")
    env = job_env(p)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert env["SGLANG_ROUTER_BASE_URL"] == "http://10.0.0.1:30080"
    assert "SLIME_HOST_IP" not in env and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env
    assert {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")} == ray_auth.process_env(
        ray_auth.CONTAINER_TOKEN_PATH
    )
    launch = exports(p)
    assert launch["SLIME_HOST_IP"] == "10.0.0.1" and launch["NCCL_SOCKET_IFNAME"] == "ens1f0"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in launch
    assert "ray job stop --address=http://10.0.0.1:8265" in p["files"]["launch.sh"]
    # Polar's servers stay on the head's loopback (their clients all run there); inference goes to the head's router
    assert "http://127.0.0.1:28080/health" in p["files"]["launch.sh"]
    topology = yaml.safe_load(p["files"]["topology.yaml"])
    assert topology["rollout"]["host"] == "127.0.0.1" and topology["rollout"]["public_url"] == "http://127.0.0.1:28080"
    node = topology["gateway"]["nodes"][0]
    assert node["host"] == "127.0.0.1" and node["inference"]["base_url"] == "http://10.0.0.1:30080"
    config = yaml.safe_load(p["files"]["polar_config.yaml"])
    assert config["polar_rollout_url"] == "http://127.0.0.1:28080" and config["polar_callback_host"] == "127.0.0.1"
    assert config["polar_gate_base_url"] == "http://10.0.0.1:30080"
    assert value(args, "--update-weight-disk-dir") == "/mnt/shared/weight-updates"
    assert value(args, "--save") == f"/mnt/shared/checkpoints/polarstack/humaneval-{profile}"
    assert p["cluster"]["nodes"] == 2 and [n["addr"] for n in p["cluster"]["layout"]] == list(ADDRS)
    assert p["cluster"]["layout"][1]["roles"] == ["ray-worker", "engines", "trainer-actors"]
    assert "127.0.0.1" not in " ".join(args).replace("--router-prometheus-host 127.0.0.1", "")


def test_memory_is_per_node_and_dp_grows(two_nodes, capsys, monkeypatch):
    two = plan(capsys, "--profile", "patched-router", "--set", "memory.optimizer_offload='on'")
    for key in two_nodes:
        monkeypatch.delenv(key)
    one = plan(capsys, "--profile", "patched-router", "--set", "memory.optimizer_offload='on'")
    assert (one["memory"]["data_parallel"], two["memory"]["data_parallel"]) == (1, 2)
    assert two["memory"]["nodes"] == 2 and "nodes" not in one["memory"]

    def terms(p, side):
        return {t["name"].split(":")[0]: t["gb"] for t in p["memory"][side]["terms"]}

    t1, t2 = terms(one, "trainer_gpu"), terms(two, "trainer_gpu")
    assert t1 == t2  # offloaded: the one DP-divided term is on the host
    h1, h2 = terms(one, "host"), terms(two, "host")
    assert h2["offloaded optimizer states"] == pytest.approx(h1["offloaded optimizer states"] / 2, rel=1e-3)
    assert h2["fp32 gradient copy the CPU optimizer steps on"] == pytest.approx(
        h1["fp32 gradient copy the CPU optimizer steps on"] / 2, rel=1e-3
    )
    backups = [k for k in h1 if k.startswith("weight backups")]
    assert h1[backups[0]] == h2[backups[0]]  # per rank, the same ranks per node
    assert two["cost_per_step"]["max_train_seconds"] == pytest.approx(
        one["cost_per_step"]["max_train_seconds"] / 2, rel=1e-2
    )


def test_without_offload_the_optimizer_term_halves_per_gpu(two_nodes, capsys, monkeypatch):
    two = plan(capsys, "--profile", "patched-router", "--set", "memory.optimizer_offload='off'")
    for key in two_nodes:
        monkeypatch.delenv(key)
    one = plan(capsys, "--profile", "patched-router", "--set", "memory.optimizer_offload='off'")
    name = next(t["name"] for t in one["memory"]["trainer_gpu"]["terms"] if t["name"].startswith("optimizer states"))
    gb = {
        p: next(t["gb"] for t in x["memory"]["trainer_gpu"]["terms"] if t["name"] == name)
        for p, x in (("1", one), ("2", two))
    }
    assert gb["2"] == pytest.approx(gb["1"] / 2, rel=1e-3)


def test_the_printed_plan_shows_each_node_and_the_memory_per_node(two_nodes, capsys):
    assert main(["train", "--task", "humaneval", "--profile", "patched-router", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# node 1 (10.0.0.2): ray-worker, engines, trainer-actors" in out
    assert "per node of 2" in out and "TP 2 x DP 2" in out


def test_engine_direct_is_refused_before_anything_renders(two_nodes, capsys):
    assert main(["train", "--task", "humaneval", "--profile", "engine-direct", "--dry-run"]) == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert out == "" and "engine-direct has no router" in err and "NODES=2" in err


def test_disk_without_shared_dir_is_refused(two_nodes, capsys, monkeypatch):
    monkeypatch.delenv("SHARED_DIR")
    assert main(["train", "--task", "humaneval", "--profile", "patched-router", "--dry-run"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "needs SHARED_DIR for the disk weight sync" in err and err.count("\n") == 1


def test_nccl_without_shared_dir_is_refused_for_the_checkpoints(two_nodes, capsys, monkeypatch):
    monkeypatch.delenv("SHARED_DIR")
    monkeypatch.setenv("WEIGHT_SYNC_TRANSPORT", "nccl")
    assert main(["train", "--task", "humaneval", "--profile", "patched-router", "--dry-run"]) == ExitCode.USAGE
    assert "needs SHARED_DIR for the checkpoints" in capsys.readouterr().err


def test_nccl_with_shared_dir_renders_the_nccl_sync(two_nodes, capsys, monkeypatch):
    monkeypatch.setenv("WEIGHT_SYNC_TRANSPORT", "nccl")
    args = train_args(plan(capsys, "--profile", "patched-router"))
    assert value(args, "--update-weight-transport") == "nccl" and "--update-weight-disk-dir" not in args


def test_a_save_outside_the_shared_tree_is_refused(two_nodes, capsys):
    code = main(
        ["train", "--task", "humaneval", "--profile", "patched-router", "--dry-run", "--set", "model.save=/data/x"]
    )
    assert code == ExitCode.USAGE
    assert "model.save=/data/x" in capsys.readouterr().err


def test_a_batch_that_breaks_at_dp_4_names_the_nodes(two_nodes, capsys, monkeypatch):
    monkeypatch.setenv("TRAINER_GPUS", "2,3")
    code = main(
        [
            "train",
            "--task",
            "humaneval",
            "--profile",
            "patched-router",
            "--dry-run",
            "--set",
            "parallel.default.tensor_model_parallel_size=1",
            "--set",
            "grpo.global_batch_size=6",
            "--set",
            "grpo.n_samples_per_prompt=2",
            "--set",
            "grpo.rollout_batch_size=3",
        ]
    )
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "2 nodes x 2 trainer GPUs" in err


def test_make_preflight_dry_run_renders_the_2_node_rehearsal(two_nodes, capsys):
    p = plan(capsys, "--profile", "patched-router", command="preflight")
    assert p["data_parallel_size"] == 2
    assert any("SHARED_DIR (/mnt/shared) proven one directory" in s for s in p["steps"])
    assert any("every engine of every node" in s for s in p["steps"])
    for phase in p["phases"]:
        args = train_args(phase)
        assert value(args, "--actor-num-nodes") == "2"
        assert value(args, "--save").startswith("/mnt/shared/checkpoints/")
        assert phase["cluster"]["head_addr"] == "10.0.0.1"


def test_make_preflight_refuses_engine_direct_at_2_nodes(two_nodes, capsys):
    assert main(["preflight", "--profile", "engine-direct", "--dry-run"]) == ExitCode.USAGE
    assert "engine-direct has no router" in capsys.readouterr().err
