"""What keeps the trainer's own servers on 127.0.0.1, and the check `make verify-offline` runs on it.

The trainer runs with host networking, so every server it starts must bind loopback itself (docs/exposure.md):
- the Ray head: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (polarstack.stack.ray_head; measured, configs/upstream/ray-listeners.json);
  and on loopback too, every Ray process needs the stack's token (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH at the
  trainer's read-only mount; polarstack.stack.ray_auth, measured in configs/upstream/ray-auth.json): the agent's
  shell shares the trainer's network, and an unauthenticated jobs API runs anyone's code;
- NCCL and Gloo (Megatron's groups, slime's Gloo group, the NCCL weight sync): NCCL_SOCKET_IFNAME=lo and
  GLOO_SOCKET_IFNAME=lo in the trainer, the engines, launch.sh and the Ray job (configs/upstream/socket-ifname.json);
- slime's own sglang_router, which slime v0.3.1 starts whenever the launch has no --sglang-router-ip (every
  profile without slime registration): its host is slime's get_host_info(), the machine's routable address
  unless SLIME_HOST_IP is set, and its Prometheus host is slime's --router-prometheus-host
  (configs/upstream/slime-listeners.json, read in the pinned source; not runnable without GPUs).
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.pins import pin, repo_root
from polarstack.stack import ray_auth
from polarstack.stack.cluster import INTERFACE_VARS, LOOPBACK_IFACE
from polarstack.stack.ray_head import LOOPBACK_ENV as RAY_LOOPBACK_ENV
from polarstack.stack.ray_head import exposure_problems as ray_problems

SLIME_LOOPBACK_ENV = {"SLIME_HOST_IP": "127.0.0.1"}
# NCCL's and Gloo's listeners (Megatron's groups, slime's Gloo group, the NCCL weight sync) on loopback: one node
# (polarstack.stack.cluster.interface_env; configs/upstream/socket-ifname.json).
INTERFACE_LOOPBACK_ENV = dict.fromkeys(INTERFACE_VARS, LOOPBACK_IFACE)
# The environment of the trainer container, of `make train`'s launch.sh and of the Ray job (runtime_env): Ray, slime,
# NCCL and Gloo on loopback, and Ray's token by the trainer's mounted path (ray_auth.TRAINER_ENV, never the token).
TRAINER_LOOPBACK_ENV = {**RAY_LOOPBACK_ENV, **SLIME_LOOPBACK_ENV, **INTERFACE_LOOPBACK_ENV, **ray_auth.TRAINER_ENV}
# train_async.py arguments: the Prometheus port of the router slime starts itself stays on loopback.
SLIME_ROUTER_ARGS = ["--router-prometheus-host", "127.0.0.1"]


def slime_record() -> dict[str, Any]:
    return json.loads((repo_root() / "configs" / "upstream" / "slime-listeners.json").read_text())


def slime_problems(environment: dict[str, object], train_args: list[str] | None, label: str) -> list[str]:
    """Why slime's own router would listen beyond loopback with this environment / these train_async.py
    arguments (None: not a training launch), per configs/upstream/slime-listeners.json."""
    record = slime_record()
    problems = []
    if record["commit"] != pin("SLIME_COMMIT"):
        problems.append(
            f"configs/upstream/slime-listeners.json was read at slime {record['commit']}, not "
            f"SLIME_COMMIT={pin('SLIME_COMMIT')}; reread the files it names and update it"
        )
    for key, value in record["stack_settings"]["environment"].items():
        if str(environment.get(key)) != value:
            problems.append(
                f"{label}: {key}={value} is missing, so the sglang_router slime starts itself (no "
                "--sglang-router-ip) binds the machine's routable address (slime/utils/http_utils.py, "
                "get_host_info)"
            )
    if train_args is not None and "--sglang-router-ip" not in train_args:
        wanted = record["stack_settings"]["train_args"]
        found = any(train_args[i : i + len(wanted)] == wanted for i in range(len(train_args)))
        if not found:
            problems.append(
                f"{label}: train_async.py lacks {' '.join(wanted)}, so the Prometheus port of the router "
                "slime starts itself keeps its release's default host (0.0.0.0 from sglang-router 0.2.0)"
            )
    return problems


INTERFACE_RECORD = "configs/upstream/socket-ifname.json"
WHO_PICKS = {
    "NCCL_SOCKET_IFNAME": "NCCL takes an ib* interface, else any but docker*/lo",
    "GLOO_SOCKET_IFNAME": "Gloo binds the address the hostname resolves to",
}


def interface_problems(environment: dict[str, object], label: str) -> list[str]:
    """Why NCCL or Gloo of a process with this environment (the trainer, an engine, the Ray job) would listen beyond
    loopback on one node: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME not `lo` (configs/upstream/socket-ifname.json)."""
    return [
        f"{label}: {key}={LOOPBACK_IFACE} is missing ({environment.get(key)!r}), so {WHO_PICKS[key]} "
        f"({INTERFACE_RECORD}): with host networking the node's network, for groups whose ranks all sit on this node"
        for key in INTERFACE_VARS
        if environment.get(key) != LOOPBACK_IFACE
    ]


def trainer_problems(environment: dict[str, object], label: str, train_args: list[str] | None = None) -> list[str]:
    """Every reason the trainer's servers (Ray, slime's router, NCCL, Gloo) would listen beyond loopback."""
    return (
        ray_problems(environment, label)
        + slime_problems(environment, train_args, label)
        + interface_problems(environment, label)
    )
