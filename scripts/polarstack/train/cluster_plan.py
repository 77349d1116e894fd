"""What the training plan changes at NODES > 1 (issue 28): addresses, interfaces, Ray's token, shared storage.

At NODES=1 every function here returns what the single-node plan always rendered (127.0.0.1, the loopback switches,
the weight-updates and checkpoints volumes), so that plan stays byte for byte the same (tests/fixtures/
single-node-plans.json). At NODES>1 (polarstack.stack.cluster) the facts behind each choice are recorded in
configs/upstream/multinode-facts.json (scripts/tools/record_multinode_facts.py) and checked by `make verify-offline`
(polarstack.offline.multinode):
- the engines are named by their cluster address (every node's, rank order) in --rollout-external-engine-addrs, and
  slime registers each one with the router under exactly that address (slime/backends/sglang_utils/sglang_engine.py
  _register_to_router: worker_url = http://<host>:<port> of the address given);
- the router and the Ray head (GCS, dashboard, jobs API) are on the head's address, Polar's rollout server and
  gateway on the head's 127.0.0.1 (polar_host: every client of theirs runs on the head); Ray no longer gets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which would make `ray start --address` on every
  other node abort (ray/scripts/scripts.py start: "Multi-node Ray clusters are not supported ..."): the explicit
  --node-ip-address=<cluster address> replaces it, and Ray's token guards what Ray then opens;
- NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name CLUSTER_IFACE (the same name on every node), so Megatron's groups
  and slime's Gloo group use the cluster network; SLIME_HOST_IP is each node's own address, set in each node's
  trainer container (polarstack.stack.compose.cluster_override) and left out of the job's runtime env, which would
  give every node the head's value;
- the disk weight sync and the checkpoints live under SHARED_DIR, mounted at the same path on every node: every node
  writes its part of each HF copy (slime/backends/megatron_utils/hf_checkpoint_saver.py, one writer rank per node)
  and of each checkpoint, and every engine reloads the whole copy from that one path.
"""

from __future__ import annotations

from typing import Any

from polarstack.checks import nodes
from polarstack.errors import ExitCode, StackError
from polarstack.stack import ray_auth
from polarstack.stack.cluster import LOOPBACK, Cluster, interface_env
from polarstack.stack.exposure import TRAINER_LOOPBACK_ENV

WEIGHT_UPDATES = "weight-updates"  # SHARED_DIR/<this>: the disk weight sync at NODES>1
CHECKPOINTS = "checkpoints"  # SHARED_DIR/<this>: model.save's /checkpoints at NODES>1
NODE_REPORTS = "nodes"  # SHARED_DIR/<this>/rank-<N>.json: each node's report (polarstack.checks.nodes)
CHECKPOINTS_VOLUME = "/checkpoints"  # where compose.yaml mounts the checkpoints volume in the trainer
LOGS_VOLUME = "/logs"  # where compose.yaml mounts the logs volume in the trainer (the head's, at NODES>1)
# Polar's rollout.save_dir in topology.yaml: every session's result and every completion as JSON, pruned by nothing
# (docs/gpu-node.md, "Polar's saved results"; polarstack.train.launch.check_checkpoint_space reports its free space).
POLAR_RESULTS_DIR = f"{LOGS_VOLUME}/polar-rollouts"


def trainer_env(cluster: Cluster, *, node_addr: str | None = None) -> dict[str, str]:
    """The environment of a trainer container / launch.sh at NODES>1 (`node_addr`: that node's address, for
    SLIME_HOST_IP; None leaves SLIME_HOST_IP out, as in the job's runtime env). One node: the loopback switches."""
    if not cluster.multi:
        return dict(TRAINER_LOOPBACK_ENV)
    env = {
        **({"SLIME_HOST_IP": node_addr} if node_addr is not None else {}),
        **interface_env(cluster),
        # The token by path, as the trainer container sees the host's file (read-only bind mount on every node).
        **ray_auth.process_env(ray_auth.CONTAINER_TOKEN_PATH),
    }
    return env


def launch_env(cluster: Cluster) -> dict[str, str]:
    """launch.sh's exports (it runs on the head): the head's own SLIME_HOST_IP, the interfaces, the token by path."""
    return trainer_env(cluster, node_addr=cluster.head_addr if cluster.multi else None)


def job_env(cluster: Cluster) -> dict[str, str]:
    """The Ray job's runtime env: at NODES>1 without SLIME_HOST_IP, which each node's container sets to its own
    address (a job-wide value would be the head's on every node: slime's RolloutManager binds its router on
    get_host_info(), slime/utils/http_utils.py, wherever Ray places it)."""
    return trainer_env(cluster)


def dashboard_url(cluster: Cluster, port: int | str) -> str:
    """The Ray dashboard / jobs API: 127.0.0.1 on one node; the head's address at NODES>1, where the head binds it
    (ray_head.head_command --dashboard-host)."""
    return f"http://{cluster.head_addr}:{port}"


def shared_dir(cluster: Cluster, what: str) -> str:
    """SHARED_DIR, required at NODES>1 for `what` (one sentence naming the fix otherwise)."""
    if not cluster.shared_dir:
        raise StackError(
            f"NODES={cluster.nodes} needs SHARED_DIR for {what}: a directory every node mounts at the same path (NFS "
            "or similar); set SHARED_DIR in configs/cluster.env or the environment (docs/multi-node.md, Weights and "
            "checkpoints).",
            ExitCode.USAGE,
        )
    return cluster.shared_dir.rstrip("/")


WEIGHTS_NEED = "the disk weight sync (every node writes a part of each copy and every engine of every node reads it)"
CHECKPOINTS_NEED = "the checkpoints (every node's ranks write their shards of each save, a resume reads them all)"


def check_storage(cluster: Cluster, transport: str) -> None:
    """At NODES>1, before anything renders: SHARED_DIR for the disk weight sync (WEIGHT_SYNC_TRANSPORT=disk, the
    default), else for the checkpoints, which need it whatever the transport."""
    if cluster.multi:
        shared_dir(cluster, WEIGHTS_NEED if transport == "disk" else CHECKPOINTS_NEED)


def weight_update_dir(cluster: Cluster, single_node_dir: str) -> str:
    """--update-weight-disk-dir: `single_node_dir` (the weight-updates volume) on one node; SHARED_DIR/weight-updates
    at NODES>1, which every trainer rank writes and every engine of every node reads (the same path in each)."""
    if not cluster.multi:
        return single_node_dir
    return f"{shared_dir(cluster, WEIGHTS_NEED)}/{WEIGHT_UPDATES}"


def checkpoint_root(cluster: Cluster, save: str) -> str:
    """model.save: as configured on one node; at NODES>1 the same tree under SHARED_DIR/checkpoints, since every rank
    writes its shards of a save and a resume reads all of them (Megatron's distributed checkpoint)."""
    if not cluster.multi:
        return save
    root = shared_dir(cluster, CHECKPOINTS_NEED)
    save = save.rstrip("/")
    if save == root or save.startswith(root + "/"):
        return save
    if save == CHECKPOINTS_VOLUME or save.startswith(CHECKPOINTS_VOLUME + "/"):
        return f"{root}/{CHECKPOINTS}{save[len(CHECKPOINTS_VOLUME) :]}"
    raise StackError(
        f"model.save={save} is neither under the checkpoints volume ({CHECKPOINTS_VOLUME}) nor under "
        f"SHARED_DIR={root}: at NODES={cluster.nodes} every node writes its part of each checkpoint there; set "
        "model.save under one of them.",
        ExitCode.USAGE,
    )


def checkpoint_volume(cluster: Cluster) -> str:
    """The directory whose free space bounds the saves: the checkpoints volume, or SHARED_DIR/checkpoints."""
    return CHECKPOINTS_VOLUME if not cluster.multi else f"{shared_dir(cluster, CHECKPOINTS_NEED)}/{CHECKPOINTS}"


def polar_host(cluster: Cluster) -> str:
    """Where Polar's rollout server and gateway listen and are reached: 127.0.0.1 of the head, on every node count.
    Every client of theirs runs on the head: slime's RolloutManager, which runs Polar's worker and its callback listener
    (polar_callback_host 127.0.0.1 already), is placed there (docs/multi-node.md, Placement: the workers' CPUs all go
    to the actor bundles), and the gateway starts the agent sandboxes on its own node. Their routes are mostly
    unauthenticated at POLAR_COMMIT (docs/exposure.md, Multi-node listeners), so they stay off the cluster network."""
    return LOOPBACK


def as_dict(cluster: Cluster, nodes: list[Any]) -> dict[str, Any]:
    """The plan's --json `cluster` block (NODES>1 only; the single-node plan has none)."""
    return {**cluster.as_dict(), "layout": [n.as_dict() for n in nodes]}


__all__ = [
    "check_storage",
    "checkpoint_root",
    "checkpoint_volume",
    "dashboard_url",
    "job_env",
    "launch_env",
    "polar_host",
    "trainer_env",
    "weight_update_dir",
]


# --- the node checks' figures, from the plan (polarstack.checks.nodes) ----------------------------------------------


def node_need(profile: Any, plan: Any) -> nodes.Need:
    """What every node must hold (polarstack.checks.nodes.Need) from the plan's per-node memory (MemoryPlan): the
    trainer GPU's total; the smallest card on which an engine's share (mem_fraction_static of it) holds its weights
    and one full trace's KV cache; the host's total."""
    gpus = sorted({*profile.engine_gpus, *profile.trainer_gpus})
    fraction = plan.engine_share_gb / plan.capacity.gpu_gb if plan.capacity.gpu_gb else 1.0
    pool = plan.engine[1].gb if len(plan.engine) > 1 else 0.0
    per_token = pool / plan.kv_tokens if plan.kv_tokens else 0.0  # GB per token of the KV pool
    engine_gb = (plan.engine[0].gb + plan.context_tokens * per_token) / fraction
    return nodes.Need(
        gpu_count=max(gpus) + 1,
        trainer_gpus=tuple(profile.trainer_gpus),
        engine_gpus=tuple(profile.engine_gpus),
        trainer_gpu_gb=round(plan.trainer_gb, 1),
        engine_gpu_gb=round(engine_gb, 1),
        host_gb=round(plan.host_gb, 1),
    )


def require_nodes(
    profile: Any, cluster: Cluster, plan: Any, dashboard_port: int, probe: nodes.Probe | None = None
) -> nodes.ClusterReport | None:
    """`make train` and `make preflight` at NODES>1, before anything long: every node checked (refuses like
    polarstack.checks.nodes.check); nothing on one node. Returns the report."""
    if not cluster.multi:
        return None
    return nodes.check(cluster, profile, need=node_need(profile, plan), dashboard_port=dashboard_port, probe=probe)
