"""The cluster description: one node (the default) or NODES nodes of NODE_GPUS GPUs joined by Ray.

configs/cluster.env holds the knobs (NODES, NODE_RANK, CLUSTER_IFACE, NODE_ADDRS, HEAD_ADDR, RAY_AUTH_TOKEN_FILE,
SHARED_DIR); the environment overrides each, as Compose does. At NODES=1 nothing changes: every listener binds
127.0.0.1. At NODES>1 every listener the stack configures binds that node's address on CLUSTER_IFACE, and only when
the user named that interface: there is no default and the stack passes no 0.0.0.0. Ray's own servers bind every
interface whatever address they are given (measured in tests/cluster; docs/exposure.md "Multi-node listeners").

The layout is the profile's single-node split on every node (`layout`): each node runs ENGINE_COUNT engines on
ENGINE_GPUS and len(TRAINER_GPUS) of the trainer's actors on TRAINER_GPUS (slime --actor-num-nodes NODES
--actor-num-gpus-per-node len(TRAINER_GPUS)); rank 0 (the head) also runs the Ray head, the router, Polar's rollout
server and gateway, `ray job submit` and the smoke. engine-direct has no router, so Polar, which sends to one base
URL, would use only engine-0 of the head: it is refused at NODES>1 (`refusal`).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarstack import paths
from polarstack.errors import ExitCode, StackError
from polarstack.pins import parse_env_file

KNOBS = ("NODES", "NODE_RANK", "CLUSTER_IFACE", "NODE_ADDRS", "HEAD_ADDR", "RAY_AUTH_TOKEN_FILE", "SHARED_DIR")
LOOPBACK = "127.0.0.1"


def cluster_env() -> Path:
    return paths.configs_dir() / "cluster.env"


def knobs(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """configs/cluster.env, then the environment, then `overrides` (a test's or a caller's)."""
    path = cluster_env()
    values = parse_env_file(path) if path.exists() else {}
    for key in KNOBS:
        values.setdefault(key, "")
        if key in os.environ:
            values[key] = os.environ[key]
    values.update(overrides or {})
    return values


@dataclass(frozen=True)
class Cluster:
    nodes: int
    rank: int
    iface: str | None
    addrs: tuple[str, ...]  # rank order; (127.0.0.1,) for one node
    token_file: str  # RAY_AUTH_TOKEN_FILE as configured ("" = the default path, polarstack.stack.ray_auth)
    shared_dir: str  # SHARED_DIR ("" at one node)

    @property
    def multi(self) -> bool:
        return self.nodes > 1

    @property
    def head(self) -> bool:
        return self.rank == 0

    @property
    def head_addr(self) -> str:
        return self.addrs[0]

    @property
    def addr(self) -> str:
        """This node's address: what its listeners bind and what other nodes reach it by."""
        return self.addrs[self.rank]

    def bind_host(self) -> str:
        """The host every listener of this node binds: 127.0.0.1 at one node, else this node's cluster address, once
        `check_interface` has confirmed that CLUSTER_IFACE holds it."""
        if not self.multi:
            return LOOPBACK
        self.check_interface()
        return self.addr

    def check_interface(self) -> None:
        assert self.iface is not None
        held = interface_addresses(self.iface)
        if held is None:
            raise StackError(
                f"CLUSTER_IFACE={self.iface} is not an interface of this node; name the cluster network's interface "
                "(`ip -br addr` lists them) in configs/cluster.env or the environment.",
                ExitCode.ENVIRONMENT,
            )
        if self.addr not in held:
            raise StackError(
                f"CLUSTER_IFACE={self.iface} holds {', '.join(held) or 'no IPv4 address'}, not NODE_ADDRS[{self.rank}]"
                f"={self.addr}; fix NODE_RANK or NODE_ADDRS (configs/cluster.env).",
                ExitCode.ENVIRONMENT,
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "rank": self.rank,
            "iface": self.iface,
            "addrs": list(self.addrs),
            "head_addr": self.head_addr,
            "shared_dir": self.shared_dir or None,
        }


SINGLE = Cluster(1, 0, None, (LOOPBACK,), "", "")


def _positive(values: dict[str, str], key: str, default: int) -> int:
    text = values.get(key, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise StackError(f"{key}={text} must be a whole number (configs/cluster.env).", ExitCode.USAGE)
    return int(text)


def load(overrides: dict[str, str] | None = None) -> Cluster:
    """The cluster the knobs describe, validated; one USAGE sentence naming the knob otherwise."""
    values = knobs(overrides)
    nodes = _positive(values, "NODES", 1)
    rank = _positive(values, "NODE_RANK", 0)
    if nodes < 1:
        raise StackError("NODES=0: a cluster has at least one node (configs/cluster.env).", ExitCode.USAGE)
    if rank >= nodes:
        raise StackError(f"NODE_RANK={rank} must be below NODES={nodes} (ranks 0..{nodes - 1}).", ExitCode.USAGE)
    token_file = values.get("RAY_AUTH_TOKEN_FILE", "").strip()
    shared = values.get("SHARED_DIR", "").strip()
    if shared and not shared.startswith("/"):
        raise StackError(f"SHARED_DIR={shared} must be an absolute path mounted on every node.", ExitCode.USAGE)
    if nodes == 1:
        return Cluster(1, 0, None, (LOOPBACK,), token_file, shared)
    iface = values.get("CLUSTER_IFACE", "").strip()
    if not iface:
        raise StackError(
            f"NODES={nodes} needs CLUSTER_IFACE: the interface of the cluster network that every listener binds "
            "(nothing listens beyond 127.0.0.1 unless you name it; configs/cluster.env).",
            ExitCode.USAGE,
        )
    if "/" in iface or len(iface) > 15:
        raise StackError(f"CLUSTER_IFACE={iface} is not an interface name.", ExitCode.USAGE)
    addrs = tuple(a.strip() for a in values.get("NODE_ADDRS", "").split(",") if a.strip())
    if len(addrs) != nodes:
        raise StackError(
            f"NODE_ADDRS lists {len(addrs)} address(es) for NODES={nodes}: give every node's address on "
            f"{iface}, in rank order, head first.",
            ExitCode.USAGE,
        )
    for addr in addrs:
        try:
            ip = ipaddress.IPv4Address(addr)
        except ValueError:
            raise StackError(f"NODE_ADDRS entry {addr!r} is not an IPv4 address.", ExitCode.USAGE) from None
        if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
            raise StackError(
                f"NODE_ADDRS entry {addr} cannot be reached from another node; give its address on {iface}.",
                ExitCode.USAGE,
            )
    if len(set(addrs)) != len(addrs):
        raise StackError(f"NODE_ADDRS={','.join(addrs)} names one node twice.", ExitCode.USAGE)
    head = values.get("HEAD_ADDR", "").strip()
    if head and head != addrs[0]:
        raise StackError(
            f"HEAD_ADDR={head} is not NODE_ADDRS' first entry {addrs[0]} (the head is rank 0); set one of them.",
            ExitCode.USAGE,
        )
    return Cluster(nodes, rank, iface, addrs, token_file, shared)


# --- the addresses an interface holds ----------------------------------------------------------------------


def interface_addresses(iface: str) -> list[str] | None:
    """IPv4 addresses of `iface` on this node, None when there is no such interface (iproute2's `ip`, else ioctl)."""
    if not Path("/sys/class/net", iface).exists():
        return None
    ip = shutil.which("ip")
    if ip:
        proc = subprocess.run([ip, "-o", "-4", "addr", "show", "dev", iface], capture_output=True, text=True)
        if proc.returncode == 0:
            return [line.split()[3].split("/")[0] for line in proc.stdout.splitlines() if len(line.split()) > 3]
    import fcntl

    siocgifaddr = 0x8915  # linux/sockios.h: the interface's primary address only
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return []
    return [socket.inet_ntoa(packed[20:24])]


# --- what each node runs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLayout:
    rank: int
    addr: str
    roles: tuple[str, ...]
    engine_gpus: tuple[int, ...]
    trainer_gpus: tuple[int, ...]
    engine_urls: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "addr": self.addr,
            "roles": list(self.roles),
            "engine_gpus": list(self.engine_gpus),
            "trainer_gpus": list(self.trainer_gpus),
            "engine_urls": list(self.engine_urls),
        }


HEAD_ROLES = ("ray-head", "router", "polar-rollout", "polar-gateway", "ray-job-submit", "smoke")


def refusal(profile: Any, cluster: Cluster) -> str | None:
    """Why `profile` cannot run on this cluster (one sentence), or None."""
    if cluster.multi and profile.polar_base != "router":
        return (
            f"profile {profile.name} has no router, and Polar sends every request to one base URL, so at "
            f"NODES={cluster.nodes} only engine-0 of the head would serve; use router-passthrough or patched-router "
            "on more than one node."
        )
    return None


def layout(profile: Any, cluster: Cluster) -> list[NodeLayout]:
    """Each node's part of `profile`: the single-node split repeated on every node, the head's extra roles."""
    refused = refusal(profile, cluster)
    if refused:
        raise StackError(refused, ExitCode.USAGE)
    nodes = []
    for rank, addr in enumerate(cluster.addrs):
        roles = (HEAD_ROLES if rank == 0 else ("ray-worker",)) + ("engines", "trainer-actors")
        if profile.router is None:
            roles = tuple(r for r in roles if r != "router")
        urls = tuple(f"http://{addr}:{profile.engine_port(i)}" for i in range(profile.engine_count))
        nodes.append(NodeLayout(rank, addr, roles, tuple(profile.engine_gpus), tuple(profile.trainer_gpus), urls))
    return nodes


# What torch's NCCL and Gloo backends read to pick their interface: CLUSTER_IFACE at NODES>1 (the trainer containers, the
# engines for slime's NCCL weight sync, launch.sh and the Ray job: polarstack.train.cluster_plan), `lo` on one node
# (compose.yaml's x-loopback-interfaces, exposure.TRAINER_LOOPBACK_ENV). Unset, NCCL picks an ib* interface, else any
# but docker*/lo (NCCL's src/misc/socket.cc ncclFindInterfaces), Gloo the address the hostname resolves to (torch's
# ProcessGroupGloo createDefaultDevice; measured): with host networking the node's network, or an interface that is
# down, for groups whose ranks all sit on this one node (configs/upstream/socket-ifname.json).
INTERFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
LOOPBACK_IFACE = "lo"


def interface_env(cluster: Cluster) -> dict[str, str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: CLUSTER_IFACE at NODES>1, `lo` on one node."""
    if not cluster.multi:
        return dict.fromkeys(INTERFACE_VARS, LOOPBACK_IFACE)
    assert cluster.iface is not None
    return {key: cluster.iface for key in INTERFACE_VARS}


def engine_urls(profile: Any, cluster: Cluster) -> list[str]:
    """Every engine of the cluster, by the address other nodes reach it by, rank order then engine order."""
    return [url for node in layout(profile, cluster) for url in node.engine_urls]
