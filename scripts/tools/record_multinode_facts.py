#!/usr/bin/env python3
"""Record the upstream facts the multi-node plan rests on (issue 28) into configs/upstream/multinode-facts.json.

  .venv/bin/python scripts/tools/record_multinode_facts.py /work/.mirror/THUDM+slime/repo \
      > configs/upstream/multinode-facts.json

Three kinds of fact, each with where it comes from:
- slime at SLIME_COMMIT (a clone or bare mirror given as the argument): one line found by a pattern per fact, with its
  line number and text, as record_memory_facts.py does: how the actors' placement group spreads over the nodes, where
  Megatron's master address and port come from, which address slime registers an external engine under, what binds
  SLIME_HOST_IP, and which weight-update transport crosses nodes;
- the pinned ray (RAY_VERSION, the cached venv polarstack.stack.ray_head.install makes): the lines in its source that
  make `ray start --address` abort under RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and give a worker its node IP, and
  measured: a head started with token authentication (RAY_AUTH_MODE=token, a 0600 token file made here, never
  printed), which routes of its dashboard and of its dashboard agent answer without the token;
- torch's TCPStore (Megatron's rendezvous at MASTER_ADDR:MASTER_PORT, slime's NCCL weight-sync group): measured with
  the torch the pinned sglang requires (its wheel's Requires-Dist, the sglang venv polarstack.stack.real_sglang
  installs: --torch-python), a master store started for host 127.0.0.1 and its listening socket read from `ss`.
Polar's facts (its callback listener) were read with the search tools in NVIDIA-NeMo/ProRL-Agent-Server at
POLAR_COMMIT and are kept as stated text (POLAR_FACTS): no local copy of Polar exists to re-read them.
`make verify-offline` (polarstack.offline.multinode) checks that each recorded line still says what the plan
assumes and that the 2-node plan obeys every fact.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# key: (file, pattern, lines of context after the match to keep)
SLIME_FACTS = {
    "actor_gpus": (
        "slime/ray/placement_group.py",
        r"actor_num_gpus = args\.actor_num_nodes \* args\.actor_num_gpus_per_node",
        0,
    ),
    "external_placement_group": ("slime/ray/placement_group.py", r"if args\.rollout_external:", 3),
    "bundle_per_gpu": ("slime/ray/placement_group.py", r'bundles = \[\{"GPU": 1, "CPU": 1\}', 0),
    "pack_strategy": ("slime/ray/placement_group.py", r'placement_group\(bundles, strategy="PACK"\)', 0),
    "ranks_sorted_by_node_ip": ("slime/ray/placement_group.py", r"# Sort by node IP number and then by GPU ID", 0),
    "placement_group_first": ("train_async.py", r"pgs = create_placement_groups\(args\)", 0),
    "rollout_manager_cpu": ("slime/ray/placement_group.py", r'"num_cpus": 1,', 0),
    "master_from_rank_0": (
        "slime/ray/actor_group.py",
        r"master_addr, master_port = ray\.get\(actor\.get_master_addr_and_port\.remote\(\)\)",
        0,
    ),
    "master_port_range": ("slime/ray/train_actor.py", r"start_port=random\.randint\(20000, 21000\)", 0),
    "master_env": ("slime/ray/train_actor.py", r'os\.environ\["MASTER_ADDR"\] = self\.master_addr', 0),
    "node_ip_from_ray": ("slime/utils/misc.py", r"address = ray\._private\.services\.get_node_ip_address\(\)", 0),
    "host_ip_env": ("slime/utils/http_utils.py", r"if env_overwrite_local_ip := os\.getenv\(SLIME_HOST_IP_ENV", 1),
    "own_router_host": ("slime/ray/rollout.py", r"router_ip = _wrap_ipv6\(get_host_info\(\)\[1\]\)", 0),
    "external_engine_host": ("slime/backends/sglang_utils/external.py", r'"host": info\.host,', 0),
    "register_worker_url": (
        "slime/backends/sglang_utils/sglang_engine.py",
        r'worker_url = f"http://\{self\.server_host\}:\{self\.server_port\}"',
        0,
    ),
    "disk_every_rank_writes": (
        "slime/backends/megatron_utils/update_weight/update_weight_from_disk.py",
        r"# every writing rank creates the dir itself",
        2,
    ),
    "disk_writer_per_node": (
        "slime/backends/megatron_utils/hf_checkpoint_saver.py",
        r"writer_ranks = \[node \* gpus_per_node for node in range\(num_nodes\)",
        0,
    ),
    "disk_engines_reload_one_path": ("slime/ray/actor_group.py", r"engine\.update_weights_from_disk\.remote\(", 1),
    "nccl_master_node_ip": (
        "slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py",
        r"master_address = ray\._private\.services\.get_node_ip_address\(\)",
        0,
    ),
    "nccl_engines_join_master": (
        "slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py",
        r"engine\.init_weights_update_group\.remote\(",
        1,
    ),
    "nccl_tcp_rendezvous": (
        "slime/backends/megatron_utils/update_weight/update_weight_from_distributed.py",
        r'init_method=f"tcp://\{_wrap_ipv6\(master_address\)\}:\{master_port\}"',
        0,
    ),
    "gloo_group": ("slime/utils/distributed_utils.py", r'GLOO_GROUP = new_group\(backend="gloo"\)', 0),
}
# key: (file under site-packages/ray, pattern, lines after)
RAY_FACTS = {
    "join_refused_without_cluster": ("scripts/scripts.py", r"# Start worker node\.", 2),
    "join_refusal_text": (
        "scripts/scripts.py",
        r'"Multi-node Ray clusters are not supported on Windows and OSX\. "',
        0,
    ),
    "enable_cluster_default": ("_private/ray_constants.py", r"^ENABLE_RAY_CLUSTER = env_bool\(", 3),
    "worker_node_ip": ("_private/services.py", r"return ray\._private\.worker\._global_node\.node_ip_address", 0),
    "agent_port": ("_private/ray_constants.py", r"^DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = ", 0),
    "node_affinity": ("util/scheduling_strategies.py", r"^class NodeAffinitySchedulingStrategy", 0),
}
POLAR_FACTS = [
    {
        "file": "src/slime_bridge/rollout.py",
        "function": "AsyncPolarRolloutWorker._start_callback_listener",
        "fact": "the worker (inside slime's rollout function, in the RolloutManager) serves TaskResult callbacks with "
        "uvicorn on host=polar_callback_host, port 0, and tells Polar's rollout server that URL",
    },
    {
        "file": "src/slime_bridge/rollout.py",
        "constant": "_CALLBACK_FALLBACK_POLL_SECONDS",
        "fact": "60.0: a dropped callback is made good by polling the task every 60 s",
    },
    {
        "file": "src/slime_bridge/config.py",
        "function": "resolve_polar_slime_config",
        "fact": "polar_callback_host must be non-empty and not a wildcard (0.0.0.0, ::); a loopback host is accepted",
    },
]
READ_POLAR_WITH = "the search tools (NVIDIA-NeMo/ProRL-Agent-Server at POLAR_COMMIT); no local copy to re-read"


def pin(name: str) -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"configs/pins.env has no {name}")


def find(text: str, pattern: str, after: int) -> list[dict]:
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines, 1):
        if re.search(pattern, line):
            found.append({"line": number, "text": "\n".join(x.strip() for x in lines[number - 1 : number + after])})
    if not found:
        raise SystemExit(f"pattern {pattern!r} not found; read the source again")
    return found


def slime_facts(repo: str, commit: str) -> dict:
    bare = (Path(repo) / "HEAD").is_file() and (Path(repo) / "objects").is_dir()
    git = ["git", f"--git-dir={repo}"] if bare else ["git", "-C", repo]

    def show(path: str) -> str:
        return subprocess.run([*git, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout

    return {key: {"file": f, "found": find(show(f), p, a)} for key, (f, p, a) in SLIME_FACTS.items()}


def _session_pids(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == pid:
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_token_routes(bin_dir: Path) -> dict:
    """A head with token auth on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps it there): each route's status
    without and with the token, the agent's health route, and `ray status` without the token. Stopped by its pids."""
    import httpx

    gcs, dashboard, agent = _free_port(), _free_port(), _free_port()
    temp = Path(tempfile.mkdtemp(prefix="ps-mn-", dir="/tmp"))
    token = temp / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_TMPDIR": str(temp),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    command = [
        str(bin_dir / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent}",
        "--num-gpus=0",
        "--disable-usage-stats",
    ]
    with open(temp / "ray.log", "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    header = {"Authorization": f"Bearer {token.read_text().strip()}"}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{dashboard}/api/version", headers=header, timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            raise SystemExit("the token-auth head did not answer within 120 s (see its log)")
        time.sleep(5)  # the agent starts after the dashboard
        routes = {}
        for server, port, path in (
            ("dashboard", dashboard, "/api/version"),
            ("dashboard", dashboard, "/api/gcs_healthz"),
            ("dashboard", dashboard, "/api/v0/nodes"),
            ("agent", agent, "/api/local_raylet_healthz"),
        ):
            bare = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=20).status_code
            signed = httpx.get(f"http://127.0.0.1:{port}{path}", headers=header, timeout=20).status_code
            routes[f"{server} {path}"] = {"without_token": bare, "with_token": signed}
        no_token = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
        status = subprocess.run(
            [str(bin_dir / "ray"), "status", f"--address=127.0.0.1:{gcs}"],
            env=no_token,
            capture_output=True,
            text=True,
            timeout=120,
        ).returncode
    finally:
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _session_pids(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in _session_pids(process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)
    return {"routes": routes, "ray_status_without_token_exit": status}


TCPSTORE_SCRIPT = """
import datetime, json, subprocess, sys
import torch
from torch.distributed import TCPStore
rows = []
for libuv in (True, False):
    store = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10), use_libuv=libuv)
    port = store.port
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
    rows.append({"use_libuv": libuv, "host_name": "127.0.0.1",
                 "listening": sorted({l.split()[3].rsplit(":", 1)[0] for l in out.splitlines()
                                      if l.split()[3].endswith(f":{port}")})})
    del store
print(json.dumps({"torch": torch.__version__, "stores": rows}))
"""


def measure_tcpstore(python: Path) -> dict:
    proc = subprocess.run([str(python), "-c", TCPSTORE_SCRIPT], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"the TCPStore measurement failed: {proc.stderr.strip().splitlines()[-1:]}")
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    metadata = next(Path(python).parents[1].glob("lib/python*/site-packages/sglang-*.dist-info/METADATA"), None)
    required = None
    if metadata is not None:
        match = re.search(r"^Requires-Dist: torch==([^\s;]+)", metadata.read_text(), re.M)
        required = match.group(1) if match else None
    return {**measured, "sglang_requires_torch": required}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slime_repo", help="a clone or bare mirror of THUDM/slime holding SLIME_COMMIT")
    parser.add_argument("--torch-python", default=None, help="a python with the torch sglang requires")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    from polarstack.stack import ray_head, real_sglang

    commit = pin("SLIME_COMMIT")
    bin_dir, _ = ray_head.install()
    site = next((bin_dir.parent / "lib").glob("python*/site-packages/ray"))
    ray_facts = {
        key: {"file": f"ray/{f}", "found": find((site / f).read_text(), p, a)} for key, (f, p, a) in RAY_FACTS.items()
    }
    torch_python = Path(args.torch_python) if args.torch_python else real_sglang.venv_dir() / "bin" / "python"
    record = {
        "what": "upstream facts the multi-node plan rests on (record_multinode_facts.py; docs/multi-node.md)",
        "slime_commit": commit,
        "ray_version": pin("RAY_VERSION"),
        "sglang_version": pin("SGLANG_VERSION"),
        "polar_commit": pin("POLAR_COMMIT"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_multinode_facts.py",
        "slime": slime_facts(args.slime_repo, commit),
        "ray": ray_facts,
        "ray_token_measured": measure_token_routes(bin_dir),
        "tcpstore_measured": measure_tcpstore(torch_python),
        "polar": {"read_with": READ_POLAR_WITH, "facts": POLAR_FACTS},
        "megatron": {
            "read_with": "not read: Megatron-LM is not mirrored here",
            "fact": "a save with the distributed checkpoint format has every rank write its own shards into --save "
            "and a resume read them all (Megatron-LM's documented torch_dist format): argued, not read",
        },
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
