"""One node's Ray process for the local runtime at NODES>1: the head on rank 0, a worker joining it elsewhere.

Both run the pinned ray from the cache (ray_head.install) as `ray start ... --block` in a session of their own that
outlives `polarstack up`, with token authentication (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH: polarstack.stack.
ray_auth) and bound to the node's cluster address (ray_head.head_command / worker_command with node_ip). `down`
stops the session by its leader's pid (`stop_session`). At NODES=1 the local runtime starts no Ray (as before).

Readiness is read through the head's dashboard with the token in the Authorization header, so it also proves that
this node's token file is the head's (a wrong token answers 403, none 401: ray/_private/authentication/
http_token_authentication.py `token_auth_middleware`):
- the head is up once GET /api/version answers 200 (the path needs the token under token auth; /api/gcs_healthz
  is exempt, http_server_head.py, and so proves nothing about the token);
- a node has joined once the state API (GET /api/v0/nodes, ray/util/state) lists its address ALIVE.
Measured with the pinned ray in network namespaces: tests/cluster/test_netns_cluster.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.processes import child_env, start_time
from polarstack.stack import ray_auth, ray_head
from polarstack.stack.listeners import session_pids

POLL_SECONDS = 0.5
STOP_SECONDS = 15.0  # `ray start --block` stops its children on SIGTERM (measured: under 8 s); then SIGKILL
# Variables a Ray process of the cluster must not inherit: the single-node switch makes `ray start --address` abort
# (ray_head's docstring), and a token given by value would be used instead of the stack's file.
DROPPED_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_TOKEN", "RAY_ADDRESS")


def ray_env(token_file: Path, bin_dir: Path, temp_dir: Path) -> dict[str, str]:
    """The environment of a Ray process of the cluster: the token by path, a private temp dir, the pinned ray first
    on PATH (its `ray start` starts further ray programs by name)."""
    env = {k: v for k, v in child_env().items() if k not in DROPPED_ENV}
    env.update(ray_auth.process_env(token_file))
    env["RAY_TMPDIR"] = str(temp_dir)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def short_temp_dir() -> Path:
    """Ray's session sockets are AF_UNIX paths under its temp dir (at most 107 bytes): a short folder under /tmp."""
    return Path(tempfile.mkdtemp(prefix="ps-ray-", dir="/tmp"))


def spawn(command: list[str], *, bin_dir: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start a blocking `ray start` line in a session of its own (it outlives `polarstack up` and a Ctrl-C there)."""
    if command[:2] != ["ray", "start"] or "--block" not in command:
        raise StackError(f"{command[:3]} is not a blocking `ray start` command.", ExitCode.USAGE)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(bin_dir / "ray"), *command[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def entry(role: str, process: subprocess.Popen, command: list[str], url: str, log_path: Path, temp_dir: Path):
    """The run-state record of a Ray node process: stopped as a session (`session`), its temp dir removed after."""
    return {
        "role": role,
        "pid": process.pid,
        "cmd": command[1:],
        "start_time": start_time(process.pid),
        "url": url,
        "log": str(log_path),
        "session": True,
        "temp_dir": str(temp_dir),
    }


def _log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-2:])


def _get(url: str, token_file: Path, timeout: float = 3.0) -> httpx.Response:
    return httpx.get(url, headers=ray_auth.auth_header(token_file), timeout=timeout, trust_env=False)


def _token_refused(response: httpx.Response, dashboard: str, token_file: Path) -> StackError:
    return StackError(
        f"the Ray head at {dashboard} refused the token in {token_file} (HTTP {response.status_code}); copy the "
        "head's token file (RAY_AUTH_TOKEN_FILE on rank 0) to this node, mode 0600, and run `make up` again.",
        ExitCode.ENVIRONMENT,
    )


def wait_head(
    dashboard: str, token_file: Path, timeout: float, process: subprocess.Popen | None = None, log_path=None
) -> float:
    """Poll the head's GET /api/version with the token until 200; seconds waited. On rank 0 `process` is the head
    (its exit ends the wait); on a worker node there is none, and the sentence says to start the head."""
    started = time.monotonic()
    while True:
        if process is not None and process.poll() is not None:
            raise StackError(
                f"`ray start --head` exited with code {process.returncode}: {_log_tail(log_path)}",
                ExitCode.ENVIRONMENT,
            )
        try:
            response = _get(f"{dashboard}/api/version", token_file)
            if response.status_code in (401, 403):
                raise _token_refused(response, dashboard, token_file)
            if response.is_success:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        if time.monotonic() - started > timeout:
            where = (
                f"(see {log_path})"
                if process is not None
                else "; run `make up RUNTIME=local` on rank 0 (NODE_RANK=0) first, or raise --wait-nodes"
            )
            raise StackError(
                f"the Ray head's dashboard {dashboard} did not answer within {timeout:g} s {where}.",
                ExitCode.UNREACHABLE,
            )
        time.sleep(POLL_SECONDS)


def alive_nodes(dashboard: str, token_file: Path) -> list[str]:
    """The addresses of the nodes the head's state API lists ALIVE (GET /api/v0/nodes, with the token)."""
    response = _get(f"{dashboard}/api/v0/nodes?detail=1&limit=1000", token_file, timeout=10.0)
    if response.status_code in (401, 403):
        raise _token_refused(response, dashboard, token_file)
    response.raise_for_status()
    rows = response.json()["data"]["result"]["result"]
    return sorted(row["node_ip"] for row in rows if row.get("state") == "ALIVE")


def wait_nodes(
    dashboard: str,
    token_file: Path,
    addrs: list[str],
    timeout: float,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
) -> list[str]:
    """Wait until the head lists every one of `addrs` ALIVE; the alive addresses. `process`: this node's own Ray
    process, whose exit ends the wait. Timeout: one sentence naming the nodes still missing."""
    started = time.monotonic()
    alive: list[str] = []
    while True:
        if process is not None and process.poll() is not None:
            raise StackError(
                f"`ray start` exited with code {process.returncode}: {_log_tail(log_path) if log_path else ''}",
                ExitCode.ENVIRONMENT,
            )
        try:
            alive = alive_nodes(dashboard, token_file)
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            pass
        missing = [a for a in addrs if a not in alive]
        if not missing:
            return alive
        if time.monotonic() - started > timeout:
            raise StackError(
                f"the Ray cluster at {dashboard} lists {len(alive)} alive node(s) ({', '.join(alive) or 'none'}) "
                f"after {timeout:g} s, not {', '.join(missing)}; run `make up RUNTIME=local` with that node's "
                "NODE_RANK there (same RAY_AUTH_TOKEN_FILE contents), or raise --wait-nodes.",
                ExitCode.UNREACHABLE,
            )
        time.sleep(POLL_SECONDS)


def stop_session(record: dict[str, Any], timeout: float = STOP_SECONDS) -> list[int]:
    """Stop the Ray node of `record` (its `ray start --block` leads a session): SIGTERM to the leader when it is
    still the process we started (pid and start time), then SIGKILL to every process left in its session.

    The session id is the leader's pid; Linux does not hand that number to a new process while any process still
    holds it as its session id, so the members listed are ours even after the leader has exited. Returns the pids
    that needed SIGKILL."""
    leader = record["pid"]
    if record.get("start_time") is not None and start_time(leader) == record["start_time"]:
        try:
            os.kill(leader, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and session_pids(leader):
            _reap(leader)
            time.sleep(0.2)
    killed = ray_head.kill_session(leader, timeout)
    _reap(leader)
    return killed


def _reap(pid: int) -> None:
    """Collect the leader's exit status when this process started it (`up` and `down` in one process: tests)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def head_line(addr: str, gcs_port: int, dashboard_port: int) -> list[str]:
    """`ray start --head --block` on `addr` (the local runtime runs no trainer: no GPU is offered to Ray)."""
    return ray_head.head_command(gcs_port=gcs_port, dashboard_port=dashboard_port, num_gpus=0, block=True, node_ip=addr)


def worker_line(head_addr: str, gcs_port: int, addr: str) -> list[str]:
    return ray_head.worker_command(head_addr=head_addr, gcs_port=gcs_port, node_ip=addr, num_gpus=0, block=True)
