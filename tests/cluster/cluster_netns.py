"""Network namespaces joined by one bridge, for the cluster tier (tests/cluster): nodes of a cluster on one machine.

`create` makes one namespace per role (names suffixed with this process's pid, so parallel runs never share one),
a bridge in the root namespace with no address (so the root namespace gains no route), and one veth pair per
namespace: the host end on the bridge, the other end moved into the namespace and renamed IFACE (the same name
on every node, as configs/cluster.env asks), holding an address of a /24 in 198.18.0.0/15 (RFC 2544's benchmarking
range) picked by the test. Each namespace has `lo` up and no route beyond its /24: traffic can go only to the
other namespaces' addresses and to its own loopback. `remove` deletes the namespaces (their veth ends go with
them, and the host ends with those) and the bridge, and `leftovers` says what of it still exists.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

IFACE = "cl0"
PREFIX = 24


def missing_tools() -> str | None:
    """Why this machine cannot run the tier (None: it can): root and iproute2's `ip netns` are needed."""
    if os.geteuid() != 0:
        return "the cluster tier needs root (ip netns, veth pairs, a bridge)"
    ip = shutil.which("ip")
    if ip is None:
        return "the cluster tier needs iproute2's `ip` command"
    proc = subprocess.run([ip, "netns", "list"], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"the cluster tier needs `ip netns` ({proc.stderr.strip() or 'it failed'})"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _root_addresses() -> list[str]:
    proc = _ip("-o", "-4", "addr", "show", check=False)
    return [line.split()[3] for line in proc.stdout.splitlines() if len(line.split()) > 3]


@dataclass
class Topology:
    tag: str
    subnet: str  # "198.18.N" or "198.19.N": the first three octets
    names: dict[str, str]  # role -> namespace name
    addrs: dict[str, str]  # role -> address on IFACE
    bridge: str
    host_links: dict[str, str]  # role -> the veth end left on the bridge
    created: list[str] = field(default_factory=list)  # what exists, for `remove`

    def exec(self, role: str) -> list[str]:
        """The prefix that runs a command in `role`'s namespace."""
        return ["ip", "netns", "exec", self.names[role]]

    def pids(self, role: str) -> list[int]:
        """Every process in `role`'s namespace (`ip netns pids`)."""
        proc = _ip("netns", "pids", self.names[role], check=False)
        return sorted(int(x) for x in proc.stdout.split() if x.isdigit())

    def proc_net(self, role: str) -> str | None:
        """/proc/<pid>/net of some process in the namespace (its sockets), None when none runs there."""
        pids = self.pids(role)
        return f"/proc/{pids[0]}/net" if pids else None

    def leftovers(self) -> list[str]:
        """Which of this topology's namespaces and links still exist."""
        left = []
        listed = _ip("netns", "list", check=False).stdout.split()
        left += [f"namespace {name}" for name in self.names.values() if name in listed]
        links = _ip("-o", "link", "show", check=False).stdout
        names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line]
        left += [f"link {link}" for link in [self.bridge, *self.host_links.values()] if link in names]
        return left


def create(roles: tuple[str, ...], tag: str | None = None) -> Topology:
    """The namespaces of `roles` on one bridge (module docstring); on any failure what was made is removed."""
    tag = tag or str(os.getpid())
    taken = {a.rsplit(".", 1)[0] for a in _root_addresses()}
    # never the private dockerd's: its bridge 198.18.0.1/24 and its Compose pool 198.18.64.0/18 (polarstack.stack.dockerd),
    # which hold no address on this namespace until a network is made
    docker = {f"198.18.{b}" for b in (0, *range(64, 128))}
    choices = [f"198.{a}.{b}" for a in (18, 19) for b in range(1, 255) if f"198.{a}.{b}" not in taken | docker]
    subnet = random.choice(choices)
    letters = {role: role.replace("node-", "")[:1] for role in roles}
    topo = Topology(
        tag=tag,
        subnet=subnet,
        names={role: f"ps-{role}-{tag}" for role in roles},
        addrs={role: f"{subnet}.{index + 1}" for index, role in enumerate(roles)},
        bridge=f"psbr{tag}"[:15],
        host_links={role: f"ps{letters[role]}{tag}"[:15] for role in roles},
    )
    try:
        _ip("link", "add", topo.bridge, "type", "bridge")
        topo.created.append(f"link:{topo.bridge}")
        _ip("link", "set", topo.bridge, "up")
        for role in roles:
            ns, host_end = topo.names[role], topo.host_links[role]
            _ip("netns", "add", ns)
            topo.created.append(f"netns:{ns}")
            peer = f"{host_end}p"[:15]
            _ip("link", "add", host_end, "type", "veth", "peer", "name", peer)
            _ip("link", "set", host_end, "master", topo.bridge, "up")
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", IFACE)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{topo.addrs[role]}/{PREFIX}", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
    except BaseException:
        remove(topo)
        raise
    return topo


def remove(topo: Topology) -> None:
    """Delete the namespaces (their veth ends, and so the host ends, go with them) and the bridge."""
    for name in topo.names.values():
        _ip("netns", "del", name, check=False)
    for link in topo.host_links.values():  # gone with their peers; a half-made pair may be left
        _ip("link", "del", link, check=False)
    _ip("link", "del", topo.bridge, check=False)
    for name in topo.names.values():  # `ip netns del` leaves the bind mount's file only on failure
        path = Path("/run/netns") / name
        if path.exists():
            _ip("netns", "del", name, check=False)
