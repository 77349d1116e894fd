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
import sys
import tempfile
from pathlib import Path

from polarstack.pins import pin
from polarstack.processes import free_port
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


def run(env: dict[str, str], bin_dir: Path) -> list[dict[str, object]]:
    gcs, dashboard = free_port(), free_port()
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
        rows.append({"server": server, "address": item.address, "loopback": item.loopback})
    return sorted(rows, key=lambda r: (str(r["server"]), str(r["address"])))


def main() -> int:
    bin_dir, seconds = ray_head.install()
    record = {
        "what": "Listening TCP sockets of the trainer's Ray head (gcs_server, raylet, dashboard, agents, client "
        "server), measured by starting it on a CPU machine; see scripts/polarstack/stack/ray_head.py.",
        "ray_version": pin("RAY_VERSION"),
        "recorded_on": datetime.date.today().isoformat(),
        "recorded_with": "scripts/tools/record_ray_listeners.py",
        "command": ray_head.head_command(gcs_port="GCS_PORT", dashboard_port="DASHBOARD_PORT", num_gpus=1, block=True),
        "loopback_env": ray_head.LOOPBACK_ENV,
        "facts": FACTS,
        "without_loopback_env": run({}, bin_dir),
        "with_loopback_env": run(dict(ray_head.LOOPBACK_ENV), bin_dir),
    }
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    print(f"ray install took {seconds:.1f} s (0 when cached)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
