#!/usr/bin/env python3
"""Record which addresses the pinned ray's head listens on, with and without the stack's loopback setting.

  .venv/bin/python scripts/tools/record_ray_listeners.py > configs/upstream/ray-listeners.json

Installs ray[default]==RAY_VERSION into the cached venv polarstack uses (~/.cache/polarstack/ray/), starts the
trainer's `ray start --head --block ...` line (polarstack.stack.ray_head.head_command) twice on free ports, once
without and once with polarstack.stack.ray_head.LOOPBACK_ENV, lists every listening TCP socket of the head's session
from /proc, and stops the session by pid. Ports are random, so the record keeps each server's address and
whether it is loopback. The source facts it explains are listed under "facts" (read in the pinned wheel:
`pip download --no-deps ray==RAY_VERSION`; file and function named, described in our own words).
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from polarstack.pins import pin
from polarstack.processes import child_env, free_ports
from polarstack.stack import ray_head

FACTS = [
    {
        "file": "ray/scripts/scripts.py",
        "function": "start",
        "fact": "a given --node-ip-address goes through services.resolve_ip_for_localhost before any process starts",
    },
    {
        "file": "ray/_private/services.py",
        "function": "resolve_ip_for_localhost",
        "fact": "a loopback host (localhost, 127.0.0.1, ::1) is replaced by get_node_ip_address(), the address "
        "other machines would use",
    },
    {
        "file": "ray/_private/services.py",
        "function": "get_node_ip_address",
        "fact": "returns the loopback address when ray_constants.ENABLE_RAY_CLUSTER is false, else the routable one",
    },
    {
        "file": "ray/_private/ray_constants.py",
        "constant": "ENABLE_RAY_CLUSTER",
        "fact": "read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, default true on Linux; false also makes `ray start "
        "--address` (joining another node) abort: a single-node cluster",
    },
    {
        "file": "ray/dashboard/http_server_agent.py",
        "function": "_start_site_with_retry",
        "fact": "the dashboard agent serves on the node IP and, when that is not loopback, on loopback as well",
    },
    {
        "file": "ray/dashboard/modules/reporter/reporter_agent.py",
        "function": "ReporterAgent (metrics exporter)",
        "fact": "the Prometheus exporter binds loopback when the node IP is loopback, else every interface",
    },
    {
        "file": "ray/_private/runtime_env/agent/main.py",
        "function": "main (bind of the agent socket)",
        "fact": "the runtime-env agent binds the node IP",
    },
    {
        "file": "ray/dashboard/head.py",
        "function": "DashboardHead (metrics server)",
        "fact": "the dashboard's own metrics server binds loopback only when the node IP is loopback",
    },
]


PORT_RULES = [
    {
        "file": "ray/scripts/scripts.py",
        "function": "start",
        "fact": "without --ray-client-server-port, a head whose ray has the client extra starts the client server on "
        "10001; --min-worker-port / --max-worker-port default to 10002 / 19999 (port_defaults)",
    },
    {
        "file": "ray/_private/parameter.py",
        "function": "RayParams.update_pre_selected_port",
        "fact": "the worker ports are the whole range min_worker_port..max_worker_port, reserved beside the fixed "
        "ports (gcs, client server, dashboard, dashboard agent) so that ray's own random picks avoid them",
    },
    {
        "file": "src/ray/raylet/worker_pool.cc (C++, read in ray-project/ray, not in the wheel)",
        "function": "WorkerPool::WorkerPool, GetNextFreePort",
        "fact": "the raylet queues every port of the range and hands each new worker process the next one it finds "
        "free, putting a released port at the back: a port of the range that another server binds later can "
        "already belong to a worker, whose gRPC server then holds it",
    },
    {
        "file": "ray/_private/node.py",
        "function": "Node._get_unused_port",
        "fact": "ports ray picks itself (node manager, object manager, the agents' gRPC, runtime-env and metrics "
        "ports) are random in [the port the kernel hands out for a bind to port 0, 65535], that is at or above "
        "the start of the kernel's ephemeral range (net.ipv4.ip_local_port_range), and free when picked",
    },
]
METRIC_PORTS = {"autoscaler_metrics": "AUTOSCALER_METRIC_PORT", "dashboard_metrics": "DASHBOARD_METRIC_PORT"}

# Read inside the pinned ray's venv: the `ray start` options' defaults and the metric constants (no env override).
DEFAULTS_PROBE = """
import json
import ray.scripts.scripts as scripts
from ray.autoscaler._private import constants as autoscaler
from ray.dashboard import consts as dashboard
params = {p.name: p.default for p in scripts.start.params}
print(json.dumps({
    "min_worker_port": params["min_worker_port"],
    "max_worker_port": params["max_worker_port"],
    "dashboard_agent_listen_port": params["dashboard_agent_listen_port"],
    "ray_client_server_port_option": params["ray_client_server_port"],
    "autoscaler_metric_port": autoscaler.AUTOSCALER_METRIC_PORT,
    "dashboard_metric_port": dashboard.DASHBOARD_METRIC_PORT,
}))
"""


def port_defaults(bin_dir: Path) -> dict[str, object]:
    env = {k: v for k, v in child_env().items() if k not in METRIC_PORTS.values()}
    proc = subprocess.run(
        [str(bin_dir / "python"), "-c", DEFAULTS_PROBE], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(proc.stdout)


def port_kind(server: str, port: int, given: dict[str, int], defaults: dict[str, object]) -> str:
    for kind, value in given.items():
        if port == value:
            return kind
    if server == "ray.util.client.server":
        return "client_server"  # not given: ray start's 10001 (PORT_RULES[0])
    if server == "DashboardAgent" and port == defaults["dashboard_agent_listen_port"]:
        return "dashboard_agent"
    return "random"


def run(env: dict[str, str], bin_dir: Path, defaults: dict[str, object], lowest: list[int]) -> list[dict[str, object]]:
    """The head's listeners; appends the lowest `random` port it saw to `lowest`."""
    gcs, dashboard, autoscaler_metrics, dashboard_metrics = free_ports(4)
    given = {
        "gcs": gcs,
        "dashboard": dashboard,
        "autoscaler_metrics": autoscaler_metrics,
        "dashboard_metrics": dashboard_metrics,
    }
    env = {**env, **{METRIC_PORTS[k]: str(given[k]) for k in METRIC_PORTS}}
    command = ray_head.head_command(gcs_port=gcs, dashboard_port=dashboard, num_gpus=1, block=True)
    temp_dir = Path(tempfile.mkdtemp(prefix="ps-ray-", dir="/tmp"))  # AF_UNIX paths: keep it short
    try:
        head = ray_head.start(command, env, bin_dir=bin_dir, temp_dir=temp_dir, dashboard_port=dashboard)
        head.stop()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    rows = []
    for item in head.listeners:
        server = next((s for s in ray_head.SERVERS if s in item.process), item.process.split()[0].rsplit("/", 1)[-1])
        rows.append(
            {
                "server": server,
                "address": item.address,
                "loopback": item.loopback,
                "port": item.port,
                "port_kind": port_kind(server, item.port, given, defaults),
            }
        )
    # Ports of kind `random` differ at every run; the rest is the same whatever the free ports were.
    lowest.append(min(int(r["port"]) for r in rows if r["port_kind"] == "random"))
    for row in rows:
        if row["port_kind"] in given:
            row["port"] = row["port_kind"].upper() + "_PORT"
        elif row["port_kind"] == "random":
            row["port"] = "RANDOM"
    return sorted(rows, key=lambda r: (str(r["server"]), str(r["address"]), str(r["port"])))


def main() -> int:
    bin_dir, seconds = ray_head.install()
    defaults = port_defaults(bin_dir)
    lowest: list[int] = []
    record = {
        "what": "Listening TCP sockets of the trainer's Ray head (gcs_server, raylet, dashboard, agents, client "
        "server), measured by starting it on a CPU machine; see scripts/polarstack/stack/ray_head.py.",
        "ray_version": pin("RAY_VERSION"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_ray_listeners.py",
        "command": ray_head.head_command(gcs_port="GCS_PORT", dashboard_port="DASHBOARD_PORT", num_gpus=1, block=True),
        "loopback_env": ray_head.LOOPBACK_ENV,
        "facts": FACTS,
        "port_defaults": defaults,
        "port_rules": PORT_RULES,
        "without_loopback_env": run({}, bin_dir, defaults, lowest),
        "with_loopback_env": run(dict(ray_head.LOOPBACK_ENV), bin_dir, defaults, lowest),
    }
    # PORT_RULES[3] seen on this machine: every random pick at or above the kernel's ephemeral range.
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    record["random_ports"] = {"lowest_seen": min(lowest), "ip_local_port_range": [low, high]}
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    print(f"ray install took {seconds:.1f} s (0 when cached)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
