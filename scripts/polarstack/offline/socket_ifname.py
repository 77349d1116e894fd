"""What configs/upstream/socket-ifname.json must say for `lo` to be the right NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
on one node (issue 34 point 3; scripts/tools/record_socket_ifname.py):
- NCCL, at every recorded release tag: with the variable unset, its first pick is the ib* interfaces and lo comes only
  after "everything but docker and lo", so on a node with any other address NCCL never takes loopback by itself;
- Gloo, measured: a named interface makes every rank listen on that interface's address (GLOO_SOCKET_IFNAME=lo on
  127.0.0.1 only), and unset it listened where the hostname resolved, not on loopback by rule.
Every process of the stack that joins an NCCL or Gloo group on one node (Megatron's ranks, slime's Gloo group, the
engines in slime's NCCL weight sync) sits in the node's one network namespace (host networking), so loopback reaches
them all; polarstack.stack.exposure.interface_problems checks the rendered environments set it.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from polarstack.pins import repo_root

RECORD = "configs/upstream/socket-ifname.json"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def problems(data: dict[str, Any] | None = None) -> list[str]:
    data = data or record()
    out = []
    tags = (data.get("nccl") or {}).get("tags") or []
    if not tags:
        out.append(f"{RECORD} holds no NCCL release; rerecord it")
    for tag in tags:
        picks = [p["prefix"] for p in tag.get("picks") or []]
        if not picks or picks[0] != "ib":
            out.append(f"{RECORD}: NCCL {tag.get('tag')} does not start with ib* ({picks}); reread ncclFindInterfaces")
            continue
        wide = next((i for i, p in enumerate(picks) if p.startswith("^") and "lo" in p[1:].split(",")), None)
        if wide is None or "lo" not in picks or picks.index("lo") < wide:
            out.append(
                f"{RECORD}: NCCL {tag.get('tag')} picks {picks}: lo is not the fallback after every other interface, "
                "so the case for NCCL_SOCKET_IFNAME=lo is not the one recorded"
            )
    gloo = data.get("gloo") or {}
    runs = {run.get("GLOO_SOCKET_IFNAME"): run for run in gloo.get("runs") or []}
    lo = runs.get("lo")
    if (
        lo is None
        or not lo.get("listened_on")
        or not all(ipaddress.ip_address(a).is_loopback for a in lo["listened_on"])
    ):
        out.append(f"{RECORD}: Gloo with GLOO_SOCKET_IFNAME=lo did not listen on loopback only ({lo})")
    named = [run for key, run in runs.items() if key not in (None, "lo")]
    if not named or any(run.get("listened_on") != [run.get("interface_address")] for run in named):
        out.append(f"{RECORD}: Gloo with a named interface did not listen on that interface's address ({named})")
    unset = runs.get(None)
    if unset is None or unset.get("listened_on") != gloo.get("hostname_resolves_to"):
        out.append(
            f"{RECORD}: Gloo without GLOO_SOCKET_IFNAME listened on {unset and unset.get('listened_on')}, not where the "
            f"hostname resolved ({gloo.get('hostname_resolves_to')})"
        )
    return out
