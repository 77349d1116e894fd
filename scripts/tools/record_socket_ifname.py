#!/usr/bin/env python3
"""Record which interface NCCL and Gloo use when NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME are unset or set.

  .venv/bin/python scripts/tools/record_socket_ifname.py /work/.mirror/NVIDIA+nccl/repo > configs/upstream/socket-ifname.json

- NCCL (a clone or bare mirror of NVIDIA/nccl given as the argument): `ncclFindInterfaces` in src/misc/socket.cc at each
  release tag of NCCL_TAGS, the lines that pick the interfaces when NCCL_SOCKET_IFNAME is unset, in order. NCCL's
  bootstrap and socket transport listen on the address of the interface picked. No GPU here: read, not run.
- Gloo (torch's CPU process groups): measured with the torch the pinned sglang requires (the sglang venv
  polarstack.stack.real_sglang installs; `--torch-python` for another): a two-rank Gloo group over a TCP rendezvous on
  127.0.0.1, started with GLOO_SOCKET_IFNAME unset, `lo` and this machine's first non-loopback interface, and the
  addresses its ranks listen on, read from /proc (polarstack.stack.listeners; the rendezvous store's port left out);
  with the hostname this machine has and what it resolves to, which the unset case binds (torch's
  ProcessGroupGloo.cpp createDefaultDevice: the hostname's address when it resolves to a usable one, loopback only as
  a fallback; read in pytorch/pytorch, the C++ source is not in the wheel).
Used by polarstack.stack.cluster (interface_env: `lo` at NODES=1) and checked by `make verify-offline`
(polarstack.offline.socket_ifname).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from polarstack.processes import child_env, free_port
from polarstack.stack import real_sglang
from polarstack.stack.listeners import listening

NCCL_TAGS = ("v2.21.5-1", "v2.26.2-1", "v2.27.7-1", "v2.28.9-1", "v2.30.7-1")
NCCL_FILE = "src/misc/socket.cc"
NCCL_PICK = re.compile(r'[Ff]indInterfaces\("([^"]+)"')

RANK = """
import sys, time
import torch.distributed as dist
port, rank = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
dist.barrier()
print("ready", flush=True)
sys.stdin.readline()
dist.destroy_process_group()
"""


def nccl_facts(repo: str) -> list[dict]:
    bare = not (Path(repo) / ".git").exists()
    git = ["git", f"--git-dir={repo}"] if bare else ["git", "-C", repo]
    out = []
    for tag in NCCL_TAGS:
        text = subprocess.run([*git, "show", f"{tag}:{NCCL_FILE}"], capture_output=True, text=True, check=True).stdout
        start = re.search(r"^(ncclResult_t|int) ncclFindInterfaces\(", text, re.M).start()
        lines = text[start:].splitlines()
        body, depth = [], 0
        for number, line in enumerate(lines, text[:start].count("\n") + 1):
            body.append((number, line))
            depth += line.count("{") - line.count("}")
            if depth == 0 and "}" in line:
                break
        picks = [
            {"line": number, "prefix": NCCL_PICK.search(line).group(1), "text": line.strip()}
            for number, line in body
            if NCCL_PICK.search(line)
        ]
        env = next(number for number, line in body if '"NCCL_SOCKET_IFNAME"' in line)
        out.append({"tag": tag, "file": NCCL_FILE, "function": "ncclFindInterfaces", "env_line": env, "picks": picks})
    return out


def other_interface() -> tuple[str, str] | None:
    """(name, IPv4 address) of this machine's first interface that is up, not loopback and has an address."""
    proc = subprocess.run(["ip", "-o", "-4", "addr", "show", "up"], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[1] != "lo":
            return fields[1], fields[3].split("/")[0]
    return None


def gloo_run(python: Path, ifname: str | None) -> list[str]:
    port = free_port()
    env = {k: v for k, v in child_env().items() if k != "GLOO_SOCKET_IFNAME"}
    if ifname is not None:
        env["GLOO_SOCKET_IFNAME"] = ifname
    ranks = [
        subprocess.Popen(
            [str(python), "-c", RANK, str(port), str(rank)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        for proc in ranks:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        found = listening([proc.pid for proc in ranks])
        return sorted({item.address for item in found if item.port != port})
    finally:
        for proc in ranks:
            try:
                proc.communicate("\n", timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nccl_repo", help="a clone or bare mirror of NVIDIA/nccl holding NCCL_TAGS")
    parser.add_argument("--torch-python", default=None, help="a python with the torch sglang requires")
    args = parser.parse_args()
    python = Path(args.torch_python) if args.torch_python else real_sglang.venv_dir() / "bin" / "python"
    torch_version = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    hostname = socket.gethostname()
    try:
        resolved = sorted({info[4][0] for info in socket.getaddrinfo(hostname, None, socket.AF_INET)})
    except socket.gaierror:
        resolved = []
    other = other_interface()
    runs = [{"GLOO_SOCKET_IFNAME": None, "listened_on": gloo_run(python, None)}]
    runs.append({"GLOO_SOCKET_IFNAME": "lo", "listened_on": gloo_run(python, "lo")})
    if other is not None:
        runs.append(
            {"GLOO_SOCKET_IFNAME": other[0], "interface_address": other[1], "listened_on": gloo_run(python, other[0])}
        )
    record = {
        "what": "The interface NCCL and Gloo listen on without and with NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: NCCL "
        "read in its source at several release tags, Gloo measured with the torch of the pinned sglang. Every "
        "service of the stack uses host networking, so an unset variable means the node's routable interface.",
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_socket_ifname.py",
        "nccl": {
            "repo": "https://github.com/NVIDIA/nccl",
            "tags": nccl_facts(args.nccl_repo),
            "fact": "with NCCL_SOCKET_IFNAME unset, NCCL takes the interfaces named ib* first, else every interface "
            "but docker*, lo (and, from 2.28, virbr*), and lo only when nothing else has an address; its bootstrap "
            "and socket transport listen on the address of the interface picked (src/bootstrap.cc bootstrapNetInit)",
        },
        "gloo": {
            "torch": torch_version,
            "source": {
                "repo": "pytorch/pytorch",
                "commit": "c194358a8ee425df52e5d940e34ba878d82d433c",
                "file": "torch/csrc/distributed/c10d/ProcessGroupGloo.cpp",
                "function": "ProcessGroupGloo::createDefaultDevice",
                "fact": "without GLOO_SOCKET_IFNAME, the device binds the address this machine's hostname resolves "
                "to when that address is usable here, and the loopback address only as a fallback (with a warning "
                "naming GLOO_SOCKET_IFNAME); with it, the named interface's address",
                "read_with": "read by a person through the public source index (the C++ source is not in the wheel)",
            },
            "hostname": hostname,
            "hostname_resolves_to": resolved,
            "runs": runs,
        },
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
