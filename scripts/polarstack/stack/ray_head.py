"""The trainer's Ray head: one command line for both runtimes, bound to loopback, and a harness that runs it.

Why an environment variable and not only `--node-ip-address=127.0.0.1` (facts recorded, with the script that
regenerates them, in configs/upstream/ray-listeners.json):
- the pinned ray (RAY_VERSION) `ray start` (ray/scripts/scripts.py, `start`) passes --node-ip-address through
  `services.resolve_ip_for_localhost`, which replaces a loopback address with `services.get_node_ip_address()`:
  the machine's routable address. Every Ray server then derives its bind address from that node IP and binds
  loopback only when the node IP is loopback (gcs_server and raylet gRPC, the dashboard agent's HTTP server in
  dashboard/http_server_agent.py, the metrics exporter in dashboard/modules/reporter/reporter_agent.py, the
  runtime-env agent in _private/runtime_env/agent/main.py); so they listened on `::`, `0.0.0.0` or the
  machine's address.
- `get_node_ip_address()` returns the loopback address when `ray_constants.ENABLE_RAY_CLUSTER` is false, which
  the environment variable RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets (its default is true on Linux). It also
  makes `ray start --address=...` (joining a worker node) refuse: a single-node cluster, which is this stack.
Measured with the pinned ray on this CPU machine (tests/integration/test_exposure.py): with the variable every
listener of the head, its agents and its workers is on 127.0.0.1; without it, GCS, raylet, agents and the client
server listen on every interface.

At NODES>1 (polarstack.stack.cluster) the variable cannot stay: with it, `ray start --address=<head>` on every other
node aborts ("Multi-node Ray clusters are not supported on Windows and OSX", ray/scripts/scripts.py `start`, the
worker branch; configs/upstream/multinode-facts.json ray.join_refused_without_cluster). The multi-node Compose
override sets it to 1 (its Linux default) and what replaces it is: --node-ip-address and --dashboard-host = the
node's address on CLUSTER_IFACE (not loopback, so resolve_ip_for_localhost leaves it alone), Ray's token
(RAY_AUTH_MODE=token, polarstack.stack.ray_auth) on everything Ray then opens, and the firewall docs/multi-node.md
asks for; GCS and raylet still listen on every interface of the node (the record's without_loopback_env).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.pins import pin, repo_root
from polarstack.processes import announced_install, child_env, favour_session, file_lock, free_ports
from polarstack.stack import ray_auth
from polarstack.stack.listeners import Listener, listening, session_pids
from polarstack.stack.profiles import stack_knobs

# Keeps the Ray node IP at 127.0.0.1 (see the module docstring); set wherever a Ray process of the stack starts.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# What polls the head's readiness (the trainer's healthcheck in compose.yaml and the image, `start` below): a path the
# pinned dashboard serves without the token (public_exact_paths in ray/dashboard/http_server_head.py, HttpServerHead.run;
# /api/version, the poll before, answers 401 under RAY_AUTH_MODE=token, and /api/healthz is public but served only by
# the dashboard agent: 404 on this port). The dashboard opens its HTTP port only after every module, the jobs API's
# included, is ready (ray/dashboard/head.py, DashboardHead.run), and this route answers 503 while the GCS does not:
# its 200 means `ray job submit` can be served. Measured: configs/upstream/ray-auth.json (record_ray_auth.py).
HEALTH_PATH = "/api/gcs_healthz"


OBJECT_STORE_KNOB = "RAY_OBJECT_STORE_GB"  # configs/stack.env, decimal GB
OBJECT_STORE_BYTES = "RAY_OBJECT_STORE_BYTES"  # rendered from it for compose.yaml's `ray start`


def object_store_gb(values: dict[str, str] | None = None) -> float:
    """Ray's object store on the trainer's node (decimal GB), as the stack sets it: `ray start --object-store-memory`
    (compose.yaml's trainer command, launch.sh's fallback `ray start`), counted by polarstack.train.memory."""
    if values is None:
        values = stack_knobs()
    raw = (values.get(OBJECT_STORE_KNOB) or "").strip()
    try:
        gb = float(raw)
    except ValueError:
        gb = float("nan")
    if not 0 < gb < float("inf"):
        raise StackError(
            f"{OBJECT_STORE_KNOB}={raw!r} must be a positive number of GB (configs/stack.env): Ray's object store.",
            ExitCode.USAGE,
        )
    return gb


def object_store_bytes(values: dict[str, str] | None = None) -> int:
    return int(object_store_gb(values) * 1e9)


def head_command(
    *,
    gcs_port: int | str,
    dashboard_port: int | str,
    num_gpus: int | str,
    block: bool = False,
    node_ip: str = "127.0.0.1",
    object_store_bytes: int | str | None = None,
) -> list[str]:
    """`ray start --head ...` as the trainer runs it (compose.yaml's trainer command adds --block). `node_ip`: the
    address every server of the head binds and other nodes reach it by (127.0.0.1 on one node; the head's address on
    CLUSTER_IFACE at NODES>1, polarstack.stack.cluster). `object_store_bytes`: --object-store-memory, which the
    trainer's Ray gets from RAY_OBJECT_STORE_GB (without it the pinned ray takes 0.3 x the memory available at start,
    up to 200 GB: configs/upstream/ray-object-store.json), so the host's memory estimate can count it."""
    return [
        "ray",
        "start",
        "--head",
        *(["--block"] if block else []),
        f"--node-ip-address={node_ip}",
        f"--port={gcs_port}",
        f"--dashboard-host={node_ip}",
        f"--dashboard-port={dashboard_port}",
        f"--num-gpus={num_gpus}",
        *([f"--object-store-memory={object_store_bytes}"] if object_store_bytes is not None else []),
        "--disable-usage-stats",
    ]


def worker_command(
    *,
    head_addr: str,
    gcs_port: int | str,
    node_ip: str,
    num_gpus: int | str,
    block: bool = False,
    num_cpus: int | str | None = None,
    object_store_bytes: int | str | None = None,
) -> list[str]:
    """`ray start --address=<head>:<gcs port>` for a node of rank > 0: it joins the head's GCS and binds `node_ip`.

    `num_cpus`: the CPUs this node offers Ray. The multi-node plan gives a worker node as many as it has trainer
    GPUs: slime's placement group takes one CPU with each GPU bundle (slime/ray/placement_group.py
    _create_placement_group, {"GPU": 1, "CPU": 1}) before anything else is scheduled (train_async.py creates it
    first), so nothing else slime starts (the RolloutManager with Polar's worker, the in-job gate, slime's own
    router, the engine handles) can land on that node: they stay on the head, next to Polar's servers and the run
    directory (configs/upstream/multinode-facts.json, placement)."""
    return [
        "ray",
        "start",
        f"--address={head_addr}:{gcs_port}",
        *(["--block"] if block else []),
        f"--node-ip-address={node_ip}",
        f"--num-gpus={num_gpus}",
        *([f"--num-cpus={num_cpus}"] if num_cpus is not None else []),
        *([f"--object-store-memory={object_store_bytes}"] if object_store_bytes is not None else []),
        "--disable-usage-stats",
    ]


# --- a cached installation of the pinned ray (tests and the recording script; the trainer image has its own) ---


def venv_dir(version: str | None = None) -> Path:
    return cache_dir() / "ray" / f"ray-{version or pin('RAY_VERSION')}"


def install(version: str | None = None) -> tuple[Path, float]:
    """Install ray[default]==version (default RAY_VERSION) into a cached venv once; (its bin dir, seconds spent)."""

    version = version or pin("RAY_VERSION")
    target = venv_dir(version)
    started = time.monotonic()
    with file_lock(target.parent / (target.name + ".lock")):
        if (target / ".installed").exists():
            return target / "bin", 0.0
        if target.exists():
            import shutil

            shutil.rmtree(target)  # a half-finished earlier install
        with announced_install(f"ray[default]=={version}", target, "once, cached for later runs"):
            subprocess.run(
                [sys.executable, "-m", "venv", str(target)], check=True, capture_output=True, env=child_env()
            )
            proc = subprocess.run(
                [
                    str(target / "bin" / "python"),
                    *("-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"ray[default]=={version}"),
                ],
                capture_output=True,
                text=True,
                env=child_env(),
            )
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise StackError(
                    f"could not install ray[default]=={version} ({tail[0]}); check that PyPI is reachable.",
                    ExitCode.ENVIRONMENT,
                )
            (target / ".installed").write_text(f"ray[default]=={version}\n")
    return target / "bin", time.monotonic() - started


# --- running a head and listing its sockets ------------------------------------------------------------------

# The servers a head runs, as they show in their command lines; `start` waits until each one listens (agents
# come up well after the dashboard answers).
SERVERS = (
    "gcs_server",
    "raylet",
    "dashboard.py",
    "DashboardAgent",
    "RuntimeEnvAgent",
    "ray.util.client.server",
    "monitor.py",
)


@dataclass
class RunningHead:
    process: subprocess.Popen
    log_path: Path
    dashboard_port: int
    listeners: list[Listener] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return session_pids(self.process.pid)

    def stop(self, timeout: float = 5.0) -> list[int]:
        """Stop every process of the head's session by pid: SIGTERM to `ray start --block` (it stops its
        children), then, after `timeout`, SIGKILL to any pid of the session still there (a throwaway head need
        not drain). Returns the pids that needed SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and session_pids(self.process.pid):
            self.process.poll()
            time.sleep(0.2)
        killed = kill_session(self.process.pid, timeout)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return killed


METRIC_PORT_ENV = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")


def kill_session(leader: int, timeout: float) -> list[int]:
    """SIGKILL every pid of `leader`'s session until it holds none, for at most `timeout` s: a Ray process can fork
    while the session is being killed (a raylet starting a worker). Returns the pids it killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while (left := session_pids(leader)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return killed


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# `ray start --block` watches its subprocesses and, when one exits, prints "Some Ray subprocesses exited unexpectedly:",
# a line "<name> [exit code=N]" for each, the tail of its .err log, then "Remaining processes will be killed." and
# exits (the pinned ray, RAY_VERSION: scripts/scripts.py, the --block loop and _log_unexpected_subprocess_exit_details).
_DECEASED = re.compile(r"-- (\S+) \[exit code=(-?\d+)\]")
_RAISED = re.compile(r"^\s*(\w+(?:Error|Exception)): (.+)$")


def exit_reason(log: str) -> str:
    """Which Ray subprocess ended `ray start --block`, and the error its log ended with; else the log's last line
    (ray's own last line, "Remaining processes will be killed.", says neither)."""
    text = _ANSI.sub("", log)
    dead = [f"{name} (exit code {code})" for name, code in _DECEASED.findall(text)]
    raised = [m.group(1) + ": " + m.group(2).strip() for m in map(_RAISED.match, text.splitlines()) if m]
    if dead:
        return f"its {', '.join(dead)} exited" + (f" with {raised[-1][:300]}" if raised else "")
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "no output"


def start(
    command: list[str],
    env: dict[str, str],
    *,
    bin_dir: Path,
    temp_dir: Path,
    dashboard_port: int,
    timeout: float = 120.0,
    settle: float = 3.0,
    session_nice: int | None = None,
) -> RunningHead:
    """Start `command` (a `ray start --head --block ...` line) in its own session; return once the dashboard
    answers and the set of listening sockets has not changed for `settle` seconds (agents start late).
    `session_nice`: the CPU share of the head's session where the kernel's autogroup applies
    (processes.favour_session), for a head started beside other busy sessions: the pinned ray gives some of its
    start-up fixed waits that no setting changes (ray_client_server's 30 s for the raylet's registration,
    _private/services.py get_node_with_retry), which a head held to one share among many busy sessions missed."""
    if command[:2] != ["ray", "start"] or "--block" not in command:
        raise StackError(f"{command[:3]} is not a blocking `ray start` command.", ExitCode.USAGE)
    if env.get("RAY_AUTH_MODE") == "token":  # the stack's token file as ray_auth accepts it (ray reads it itself)
        ray_auth.check(Path(env.get("RAY_AUTH_TOKEN_PATH") or ray_auth.token_path()))
    full_env = {**child_env(), **env, "RAY_TMPDIR": str(temp_dir), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    # Two heads on one machine's loopback (two tests at once, a recorder beside a test) collide on the Prometheus ports
    # the pinned ray fixes (AUTOSCALER_METRIC_PORT 44217, autoscaler/_private/constants.py; DASHBOARD_METRIC_PORT 44227,
    # dashboard/consts.py): the second monitor failed with Errno 98 and `ray start` waited out its timeout (measured).
    # A harness head takes free ones unless the caller set them; the trainer's own head keeps ray's (one per node).
    for key, port in zip(METRIC_PORT_ENV, free_ports(len(METRIC_PORT_ENV)), strict=True):
        full_env.setdefault(key, str(port))
    temp_dir.mkdir(parents=True, exist_ok=True)
    log_path = temp_dir / "ray-start.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(bin_dir / "ray"), *command[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
    if session_nice is not None:
        favour_session(process.pid, session_nice)  # before ray start spawns its servers: they inherit the session
    head = RunningHead(process, log_path, dashboard_port)
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{dashboard_port}{HEALTH_PATH}"
    try:
        while True:
            if process.poll() is not None:
                raise StackError(
                    f"`ray start` exited with code {process.returncode}: "
                    f"{exit_reason(log_path.read_text(errors='replace'))} (see {log_path}).",
                    ExitCode.ENVIRONMENT,
                )
            if time.monotonic() > deadline:
                raise StackError(f"the Ray head did not answer {url} within {timeout:g} s.", ExitCode.UNREACHABLE)
            try:
                if httpx.get(url, timeout=2, trust_env=False).is_success:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        seen: list[Listener] = []
        stable_since = time.monotonic()
        while True:
            now = listening(head.pids)
            missing = [c for c in SERVERS if not any(c in item.process for item in now)]
            if [(x.address, x.port) for x in now] != [(x.address, x.port) for x in seen]:
                seen, stable_since = now, time.monotonic()
            elif not missing and time.monotonic() - stable_since >= settle:
                break
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Ray head started no listening {', '.join(missing)} within {timeout:g} s (see {log_path}).",
                    ExitCode.UNREACHABLE,
                )
            if process.poll() is not None:
                raise StackError(
                    f"`ray start` exited with code {process.returncode} (see {log_path}).", ExitCode.ENVIRONMENT
                )
            time.sleep(0.5)
        head.listeners = seen
    except BaseException:
        head.stop()
        raise
    return head


# --- what `make verify-offline` checks: the rendered trainer keeps Ray on loopback, per the recorded facts ---


def recorded_listeners() -> dict:
    import json

    return json.loads((repo_root() / "configs" / "upstream" / "ray-listeners.json").read_text())


def exposure_problems(environment: dict[str, object], label: str) -> list[str]:
    """Why the Ray head of a rendered trainer (its environment) would listen beyond loopback, per
    configs/upstream/ray-listeners.json; [] when the record shows every listener on loopback with this setting."""
    record = recorded_listeners()
    problems = []
    if record.get("ray_version") != pin("RAY_VERSION"):
        problems.append(
            f"configs/upstream/ray-listeners.json was recorded for ray {record.get('ray_version')}, not "
            f"RAY_VERSION={pin('RAY_VERSION')}; rerun scripts/tools/record_ray_listeners.py"
        )
    for key, value in record["loopback_env"].items():
        if str(environment.get(key)) != value:
            problems.append(
                f"{label}: {key}={value} is not in the trainer's environment, and without it ray "
                f"{record.get('ray_version')} listens on "
                f"{sorted({r['address'] for r in record['without_loopback_env'] if not r['loopback']})}"
            )
    exposed = [r for r in record["with_loopback_env"] if not r["loopback"]]
    if exposed:
        problems.append(
            f"the recorded ray {record.get('ray_version')} head listens beyond loopback even with "
            f"{record['loopback_env']}: {exposed}"
        )
    servers = {r["server"] for r in record["with_loopback_env"]}
    if not set(SERVERS) <= servers:
        problems.append(
            f"configs/upstream/ray-listeners.json lists no socket of {sorted(set(SERVERS) - servers)}; rerecord it"
        )
    return problems
