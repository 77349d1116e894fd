"""Which TCP sockets a set of processes listens on, read from /proc (Linux), and whether each is loopback.

Used to prove "nothing listens on anything but 127.0.0.1" with the real programs the stack starts (Ray's
head, the routers): a socket belongs to a process when /proc/<pid>/fd links to its inode; the address comes
from /proc/net/tcp and /proc/net/tcp6 (state 0A is LISTEN). `::ffff:127.0.0.1` (an IPv4-mapped loopback on
a dual-stack socket) is loopback; `0.0.0.0`, `::` and the machine's own address are not.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    process: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip.is_loopback

    def as_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "process": self.process,
            "address": self.address,
            "port": self.port,
            "loopback": self.loopback,
        }


def _decode(hex_address: str, family: str) -> tuple[str, int]:
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    if family == "tcp":
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four host-order 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(ip), int(port, 16)


def listening_inodes(proc_net: str = "/proc/net") -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket in this network namespace; `proc_net`
    /proc/<pid>/net reads the namespace of that process instead (the cluster test's network namespaces)."""
    found: dict[str, tuple[str, int]] = {}
    for family in ("tcp", "tcp6"):
        try:
            lines = Path(f"{proc_net}/{family}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == TCP_LISTEN:
                found[fields[9]] = _decode(fields[1], family)
    return found


def process_name(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return cmdline or "?"  # whole: a long interpreter path must not hide the script name (issue 17)


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def session_pids(session_id: int) -> list[int]:
    """Live processes of a session (a process started with start_new_session=True leads one: sid == its pid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == session_id:
            pids.append(int(entry))
    return sorted(pids)


def listening(pids: list[int], proc_net: str = "/proc/net") -> list[Listener]:
    """The listening TCP sockets held by `pids`, deduplicated by (address, port); `proc_net`: as listening_inodes."""
    table = listening_inodes(proc_net)
    out: dict[tuple[str, int], Listener] = {}
    for pid in pids:
        for inode in socket_inodes(pid):
            if inode in table:
                address, port = table[inode]
                out.setdefault((address, port), Listener(pid, process_name(pid), address, port))
    return sorted(out.values(), key=lambda item: (item.pid, item.port))
