"""The local runtime: a profile's topology as processes on 127.0.0.1 (emulated engines + the real router).

Run state (pids, ports, resolved base URL) lives in one ignored directory (`.run/` at the repository root,
or POLARSTACK_RUN_DIR); `demo` keeps each profile's state under `.run/demo/<profile>/`, so an interrupted demo
leaves nothing `down` cannot find. `up` refuses when a live topology is recorded there; `down` stops exactly the
pids it recorded, after checking each pid still runs the command it started (a recycled pid is left alone), and
finishes even through further Ctrl-C. A recorded stack that died, or whose `up` was killed before it wrote the
base URL, is refused with STATE by `smoke`/`train` (`LocalState.usable`) rather than replaced by the docker ports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polarstack import paths
from polarstack.engine import tool_parser
from polarstack.errors import ExitCode, StackError
from polarstack.http import client as http_client
from polarstack.http import request
from polarstack.processes import child_env, free_port, port_taken, shielded, start_time, stop_pid, wait_http
from polarstack.routers import worker_api
from polarstack.routers.harness import install
from polarstack.stack import cluster as cluster_layout
from polarstack.stack import ray_auth, ray_head, ray_node, real_sglang
from polarstack.stack.cluster import Cluster, NodeLayout
from polarstack.stack.listeners import session_pids
from polarstack.stack.profiles import Profile, polar_base_url

STATE_FILE = "state.json"
LOOPBACK = "127.0.0.1"
WAIT_NODES_SECONDS = 180.0  # how long a node waits for the others (`up --wait-nodes`): they may be started by hand
RAY_READY_SECONDS = 120.0  # the pinned ray's head takes 10-30 s here; ray's own start-up timeouts are 30 s each
ENGINES = ("emulator", "sglang")  # what `up --engine` starts: the stand-in (default) or the real pinned sglang


run_dir = paths.run_dir  # kept for old imports; the rule lives in polarstack.paths


def _owned(entry: dict[str, Any]) -> bool:
    """Is entry's pid alive and still the process we started?"""
    return entry.get("start_time") is not None and start_time(entry["pid"]) == entry["start_time"]


@dataclass
class LocalState:
    path: Path
    data: dict[str, Any]

    @property
    def processes(self) -> list[dict[str, Any]]:
        return self.data["processes"]

    @property
    def profile(self) -> str:
        """The profile `up` started (read_state refuses a state without one)."""
        return self.data["profile"]

    @property
    def route(self) -> str | None:
        """The profile's POLAR_ROUTE as `up` recorded it (None in a state written without one)."""
        return self.data.get("route")

    @property
    def engine_urls(self) -> list[str]:
        """The emulated engines `up` started, in order ([] until `up` finished)."""
        return list(self.data.get("engine_urls") or [])

    @property
    def nodes(self) -> list[dict[str, Any]] | None:
        """NODES>1: every node's rank, address and engines (cluster.NodeLayout.as_dict); None on one node."""
        nodes = self.data.get("nodes")
        return nodes if isinstance(nodes, list) and nodes else None

    @property
    def engine(self) -> str:
        """The engine `up` started: emulator (the default) or sglang (the real pinned engine on the CPU)."""
        return self.data.get("engine") or "emulator"

    @property
    def tool_fields(self) -> dict[str, Any] | None:
        """Request fields the smoke adds to its tool request (the real engine's scripted tool answer), or None."""
        fields = self.data.get("tool_fields")
        return fields if isinstance(fields, dict) else None

    @property
    def tool_unscripted(self) -> str | None:
        """Why the real engine's scripted tool answer cannot reach it through this stack's router, or None: the smoke
        then caps its tool request and does not judge the outcome (checks.tool_exchange.exchange_tools)."""
        reason = self.data.get("tool_unscripted")
        return reason if isinstance(reason, str) and reason else None

    @property
    def complete(self) -> bool:
        """Did `up` finish? (it writes base_url last; a killed `up` leaves processes without one)"""
        return isinstance(self.data.get("base_url"), str)

    @property
    def base_url(self) -> str:
        if not self.complete:
            raise StackError(
                f"{self.path} records a `make up` that never finished (it was interrupted before the "
                "stack came up); run `make down RUNTIME=local` to stop what it started, then `make up` "
                "again.",
                ExitCode.STATE,
            )
        return self.data["base_url"]

    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.processes if _owned(p)]

    def usable(self) -> "LocalState":
        """This state when `up` finished and every process it started still runs; else a STATE StackError.

        The caller asked for the local stack (explicitly, or `auto` found this state): falling back to the
        docker ports here would test whatever else listens there, so a dead or half-started stack refuses.
        """
        _ = self.base_url  # refuses a half-written state
        gone = [p for p in self.processes if p not in self.live()]
        if gone:
            names = ", ".join(f"{p.get('role', '?')} (pid {p.get('pid')})" for p in gone)
            raise StackError(
                f"the local stack of profile {self.data.get('profile')} recorded in {self.path} has died "
                f"({names} gone); run `make down RUNTIME=local` and `make up PROFILE={self.data.get('profile')} "
                "RUNTIME=local` again, or pass "
                "RUNTIME=docker / --base-url to test something else.",
                ExitCode.STATE,
            )
        return self


def read_state(directory: Path | None = None) -> LocalState | None:
    path = (directory or run_dir()) / STATE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["processes"]
        if (
            not isinstance(data, dict)
            or not isinstance(entries, list)
            or not all(isinstance(e, dict) and isinstance(e.get("pid"), int) for e in entries)
            or not isinstance(data.get("profile"), str)
        ):
            raise ValueError("not a run state")
    except (ValueError, OSError, KeyError, TypeError, RecursionError):
        raise StackError(
            f"{path} is unreadable; remove it after checking no polarstack process still runs "
            "(`ps -ef | grep polarstack`).",
            ExitCode.STATE,
        ) from None
    return LocalState(path, data)


def _spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = env or child_env()
    with open(log_path, "wb") as log:
        # A new session: the topology outlives the `polarstack up` process and a Ctrl-C in its terminal.
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )


def smoke_options(target: Any, state: LocalState | None) -> dict[str, Any]:
    """What a smoke of `target` (a stack.target resolution) needs from the local stack `up` started with real
    engines (`state`, its run state as the caller read it): the scripted tool answer, why it may not reach the
    engines, and the per-request timeout of real CPU engines (real_sglang.SMOKE_TIMEOUT). Empty for any other
    target (docker, a URL, the emulator)."""
    if not getattr(target, "local", False):
        return {}
    if state is None or state.engine != "sglang":
        return {}
    return {
        "tool_fields": state.tool_fields,
        "tool_unscripted": state.tool_unscripted,
        "timeout": real_sglang.SMOKE_TIMEOUT,
    }


def _engine_command(
    profile: Profile,
    engine: str,
    port: int | str,
    index: int,
    engine_args: list[str] | None,
    host: str = LOOPBACK,
) -> list[str]:
    """The command line of engine `index` of `profile` on `port`, as both runtimes run it (compose.yaml). `host`:
    the node's cluster address at NODES>1 (emulator only); on loopback the line is the single-node one."""
    parser = profile.setting("ENGINE_TOOL_CALL_PARSER")
    if engine == "sglang":
        served = profile.setting("SERVED_MODEL_NAME")
        return real_sglang.command(port, served_model_name=served, tool_call_parser=parser or None)
    cmd = [sys.executable, "-m", "polarstack", "emulate-engine", "--port", str(port), "--seed", str(index)]
    if host != LOOPBACK:
        cmd += ["--host", host]
    if parser:
        cmd += ["--tool-call-parser", parser]
    return cmd + list(engine_args or [])  # e.g. the service-time flags of `emulate-engine`


def engine_signature(profile: Profile, engine: str, engine_args: list[str] | None = None) -> list[str]:
    """What makes engines interchangeable between profiles: engine 0's command line without its port. Shared
    engines (`start_engines`) serve a profile only when its own engines would have this same command line."""
    return _engine_command(profile, engine, "{port}", 0, engine_args)[1:]


def service_time_args(prefill_us_per_token: float, decode_us_per_token: float) -> list[str]:
    """`emulate-engine`'s service-time flags for `up --prefill-us-per-token/--decode-us-per-token` (0: left out);
    USAGE outside 0 to 1e6 microseconds."""
    out: list[str] = []
    for name, value in (("prefill-us-per-token", prefill_us_per_token), ("decode-us-per-token", decode_us_per_token)):
        if not 0 <= value < 1e6:
            raise StackError(f"--{name} must be between 0 and 1e6 microseconds.", ExitCode.USAGE)
        if value:
            out += [f"--{name}", str(value)]
    return out


def _check_engine_options(engine: str, engine_args: list[str] | None) -> None:
    if engine not in ENGINES:
        raise StackError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}.", ExitCode.USAGE)
    if engine == "sglang" and engine_args:
        raise StackError("the service-time flags apply to the emulator only, not to ENGINE=sglang.", ExitCode.USAGE)


def _base_state(profile: Profile, engine: str) -> dict[str, Any]:
    """What every local state records first, at one node and at NODES>1."""
    return {
        "profile": profile.name,
        "runtime": "local",
        "route": profile.route,
        "expect": profile.expect,
        "polar_worker_discovery": profile.values["POLAR_WORKER_DISCOVERY"],
        "engine": engine,
    }


def refuse_if_up(directory: Path | None = None) -> LocalState | None:
    """STATE while a topology recorded in `directory` still runs (a shared engine a profile's state merely borrows does
    not count: `start_engines`' own state owns it); else the stale record, if any."""
    existing = read_state(directory or run_dir())
    if existing is not None:
        alive = [p for p in existing.live() if not p.get("shared")]
        if alive:
            raise StackError(
                f"profile {existing.data['profile']} is already up locally (pids "
                f"{', '.join(str(p['pid']) for p in alive)}); run `make down RUNTIME=local` first.",
                ExitCode.STATE,
            )
    return existing


def _fresh_state(directory: Path, data: dict[str, Any]) -> LocalState:
    """A new run state in `directory`; refused while a topology recorded there still runs (refuse_if_up)."""
    existing = refuse_if_up(directory)
    if existing is not None:
        existing.path.unlink()  # stale: every recorded process is gone
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    return LocalState(directory / STATE_FILE, {**data, "started_at": time.time(), "processes": []})


def _launch_engines(
    state: LocalState,
    profile: Profile,
    count: int,
    engine: str,
    engine_args: list[str] | None,
    timeout: float,
    progress,
    host: str = LOOPBACK,
    ports: list[int] | None = None,
) -> list[str]:
    """Start `count` engines as `profile` runs them, each recorded in `state` as it starts; their URLs once ready.
    With the real engine, also the scripted tool answer's request fields (`tool_fields`). `host` and `ports`: the
    node's cluster address and the profile's engine ports at NODES>1 (other nodes find them there); else
    127.0.0.1 and free ports."""
    if engine == "sglang":  # refuses before anything starts without the disk or memory; installs once
        real_sglang.prepare(progress, servers=count)
        timeout = max(timeout, real_sglang.READY_TIMEOUT)
    logs = state.path.parent / "logs"
    began = time.monotonic()
    engines: list[tuple[subprocess.Popen, int]] = []
    for index in range(count):
        if ports is not None:
            port = ports[index]
        else:
            port = real_sglang.free_server_port() if engine == "sglang" else free_port()
        cmd = _engine_command(profile, engine, port, index, engine_args, host)
        process = _spawn(cmd, logs / f"engine-{index}.log", real_sglang.server_env() if engine == "sglang" else None)
        state.processes.append(
            {
                "role": f"engine-{index}",
                "pid": process.pid,
                "port": port,
                "cmd": cmd[1:],
                "start_time": start_time(process.pid),
                "url": f"http://{host}:{port}",
                "log": str(logs / f"engine-{index}.log"),
                **({"engine": real_sglang.spec()} if engine == "sglang" else {}),
            }
        )
        engines.append((process, port))
        _save(state)
    for index, (process, port) in enumerate(engines):
        if engine == "sglang":
            real_sglang.wait_ready(f"http://{host}:{port}", timeout, process, logs / f"engine-{index}.log")
        else:
            wait_http(f"http://{host}:{port}", timeout, process)
    kind = f"real {real_sglang.spec()}" if engine == "sglang" else "emulated"
    listed = ", ".join(str(p) for _, p in engines)
    where = "" if host == LOOPBACK else f" of {host}"
    progress(f"up: {len(engines)} {kind} engine(s){where} on {listed}, ready in {time.monotonic() - began:.0f} s")
    if engine == "sglang":  # a random model never calls a tool: the smoke's tool request scripts the answer
        state.data["tool_fields"] = real_sglang.scripted_answer(tool_parser.smoke_call_text())
    return [f"http://{host}:{port}" for _, port in engines]


SHARED_ENGINES_PROFILE = "shared engines"  # the `profile` of start_engines' run state (`down` prints it)


def start_engines(
    profile: Profile,
    count: int,
    *,
    directory: Path,
    engine: str = "emulator",
    engine_args: list[str] | None = None,
    timeout: float = 60.0,
    progress=print,
) -> LocalState:
    """Start `count` engines once, as `profile` (any profile: they differ in their router, not their engines) runs
    them, for several profiles to use in turn (`up(..., shared=...)`, `make demo`). Their run state in `directory`
    owns them: `down(directory=...)` (and `polarstack down`) stops them; a profile's `down` leaves them running.
    `reset_engines` clears what one profile's traffic leaves in them."""
    _check_engine_options(engine, engine_args)
    state = _fresh_state(
        directory,
        {
            "profile": SHARED_ENGINES_PROFILE,
            "runtime": "local",
            "engine": engine,
            "shared_engines": True,
        },
    )
    try:
        state.data["engine_urls"] = _launch_engines(state, profile, count, engine, engine_args, timeout, progress)
        state.data["engine_signature"] = engine_signature(profile, engine, engine_args)  # the real one: once installed
        state.data["base_url"] = state.data["engine_urls"][0]  # complete: `usable` checks every engine still runs
        _save(state)
        return state
    except BaseException:
        with shielded():  # a second Ctrl-C must not leave half the engines running
            _stop_all(state.processes)
            state.path.unlink(missing_ok=True)
        raise


def _borrow(state: LocalState, profile: Profile, shared: LocalState, engine: str, engine_args) -> list[str]:
    """Record `shared`'s first engines as `profile`'s (marked shared, so this profile's `down` leaves them)."""
    if shared.engine != engine or shared.data.get("engine_signature") != engine_signature(profile, engine, engine_args):
        raise StackError(
            f"the shared engines in {shared.path} run another command line than profile {profile.name}'s engines "
            f"would ({' '.join(shared.data.get('engine_signature') or [])}); start the profile on its own engines.",
            ExitCode.USAGE,
        )
    if len(shared.engine_urls) < profile.engine_count:
        raise StackError(
            f"profile {profile.name} needs {profile.engine_count} engines and {shared.path} shares only "
            f"{len(shared.engine_urls)}.",
            ExitCode.USAGE,
        )
    shared.usable()  # every shared engine still runs (else STATE, naming the one gone)
    entries = [p for p in shared.processes if p.get("role", "").startswith("engine-")][: profile.engine_count]
    state.processes.extend({**entry, "shared": str(shared.path)} for entry in entries)
    if engine == "sglang":
        state.data["tool_fields"] = shared.tool_fields
    _save(state)
    return [entry["url"] for entry in entries]


FLUSH_RETRY_SECONDS = 10.0  # sglang refuses /flush_cache while a request runs or waits (an aborted smoke request)


def reset_engines(state: LocalState) -> list[str]:
    """Clear what one profile's traffic left in shared engines before the next profile uses them; what still
    carries over afterwards, one phrase each (empty: a clean slate).

    Both engines: the prefix (radix) cache through sglang's own `/flush_cache` (sglang/srt/entrypoints/http_server.py
    `flush_cache`: 200 once flushed, 400 while requests run or wait, so it is retried). The emulator also keeps a
    request log and a fault mode: both are reset, then read back (/_emulator/requests empty, /_emulator/stats zero).
    The real engine keeps no request log; registrations live in the routers, which each profile starts afresh."""
    left: list[str] = []
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        for url in state.engine_urls:
            deadline = time.monotonic() + FLUSH_RETRY_SECONDS
            while True:
                try:
                    flushed = http.post(f"{url}/flush_cache").status_code == 200
                except httpx.HTTPError:
                    flushed = False
                if flushed or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if not flushed:
                left.append(
                    f"{url}'s prefix cache (POST /flush_cache did not answer 200 within {FLUSH_RETRY_SECONDS:g} s)"
                )
                continue
            if state.engine != "emulator":
                continue
            try:
                http.delete(f"{url}/_emulator/requests").raise_for_status()
                http.post(f"{url}/_emulator/fault", json={"mode": "none"}).raise_for_status()
                logged = http.get(f"{url}/_emulator/requests").json()["requests"]
                stats = http.get(f"{url}/_emulator/stats").json()
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                left.append(f"{url}'s request log ({exc})")
                continue
            if logged:
                left.append(f"{len(logged)} request(s) in {url}'s request log")
            if stats.get("prompt_tokens") or stats.get("cached_tokens"):
                left.append(f"{url}'s prefix cache ({stats.get('cached_tokens')} cached tokens counted)")
    return left


def stale_registrations(state: LocalState, profile: Profile) -> list[str]:
    """Workers the router `up` started for `profile` lists beyond the engines it was given (GET /workers, on
    releases with the worker API): a registration carried over from another profile would make the smoke judge
    engines this profile does not use. Empty without a router or the API."""
    release = profile.router
    router = next((p for p in state.processes if p.get("role") == "router"), None)
    if release is None or router is None or not release.has_worker_api:
        return []
    with http_client(5.0) as http:
        listed = worker_api.list_workers(http, router["url"])
    return sorted(set(listed) - set(state.engine_urls))


def up(
    profile: Profile,
    *,
    directory: Path | None = None,
    timeout: float = 60.0,
    progress=print,
    engine_args: list[str] | None = None,
    engine: str = "emulator",
    shared: LocalState | None = None,
    cluster: Cluster | None = None,
    wait_nodes: float = WAIT_NODES_SECONDS,
    before_start: Callable[[], None] | None = None,
) -> LocalState:
    """Start the profile's topology; `engine_args` go to every `emulate-engine` (e.g. its service-time flags).
    `engine`: emulator (the default), or sglang: the real pinned sglang on the CPU (polarstack.stack.real_sglang).
    `shared`: engines `start_engines` started, used instead of starting the profile's own (only its router starts).
    `cluster`: at NODES>1 this node's part of the cluster (`up_node`); None or one node: the single-node topology.
    `before_start`: a check run once the request is valid and nothing is up, before anything is written or started
    (`make up RUNTIME=local`: the verifier in Polar's namespace shape, polarstack.checks.shape_probe)."""
    _check_engine_options(engine, engine_args)
    if cluster is not None and cluster.multi:
        if shared is not None:
            raise StackError("engines shared between profiles are a single-node feature (make demo).", ExitCode.USAGE)
        return up_node(
            profile,
            cluster,
            directory=directory,
            timeout=timeout,
            progress=progress,
            engine_args=engine_args,
            engine=engine,
            wait_nodes=wait_nodes,
            before_start=before_start,
        )
    directory = directory or run_dir()
    if before_start is not None:
        refuse_if_up(directory)  # STATE first
        before_start()
    state = _fresh_state(
        directory,
        {
            **_base_state(profile, engine),
        },
    )
    started = state.processes
    try:
        release = profile.router
        if release is not None and shared is None:
            install(release)  # before any engine starts: a cold install can take seconds
        if shared is not None:
            engine_urls = _borrow(state, profile, shared, engine, engine_args)
        else:
            engine_urls = _launch_engines(state, profile, profile.engine_count, engine, engine_args, timeout, progress)
        if engine == "sglang":
            timeout = max(timeout, real_sglang.READY_TIMEOUT)
            # the script still reaches the engines when Polar bypasses the router; this router may drop its fields
            state.data["tool_unscripted"] = real_sglang.script_unreachable(release)
        if release is not None:
            _start_router(state, profile, release, engine_urls, free_port(), timeout, progress)
        state.data["base_url"] = polar_base_url(
            profile, started[-1]["url"] if release is not None else None, engine_urls
        )
        state.data["engine_urls"] = engine_urls
        _save(state)
        return state
    except BaseException:
        with shielded():  # a second Ctrl-C must not leave half the topology running
            _stop_all(started)
            state.path.unlink(missing_ok=True)
        raise


# --- NODES > 1: this node's part of the cluster ---------------------------------------------------------------


def check_port_free(host: str, port: int, what: str, knob_name: str) -> None:
    """Refuse before anything starts when `host`:`port` is taken (at NODES>1 the ports are the profile's and
    configs/stack.env's, fixed so that other nodes know them)."""
    try:
        taken = port_taken(port, host)  # as the servers bind: what a stack stopped just now left in TIME_WAIT is free
    except OSError as exc:
        raise StackError(
            f"{what} cannot listen on {host}:{port} ({exc.strerror}); check NODE_ADDRS and CLUSTER_IFACE "
            "(configs/cluster.env).",
            ExitCode.ENVIRONMENT,
        ) from None
    if taken:
        raise StackError(
            f"{what} needs {host}:{port}, which is taken; stop what listens there or move {knob_name}.",
            ExitCode.STATE,
        )


def wait_engines(urls: dict[str, NodeLayout], timeout: float) -> None:
    """Poll every other node's engines (GET /health at the address cluster.engine_urls gives) until each answers or
    `timeout` seconds pass; one sentence naming the first engine and node still silent."""
    deadline = time.monotonic() + timeout
    with http_client(2.0) as http:
        for url, node in urls.items():
            while True:
                try:
                    if 200 <= request(http, "GET", f"{url}/health").status < 300:
                        break
                except StackError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(
                        f"engine {url} of node {node.rank} ({node.addr}) did not answer /health within {timeout:g} s; "
                        f"run `make up RUNTIME=local` with NODE_RANK={node.rank} on that node (the same profile and "
                        "cluster knobs), or raise --wait-nodes.",
                        ExitCode.UNREACHABLE,
                    )
                time.sleep(0.5)


def up_node(
    profile: Profile,
    cluster: Cluster,
    *,
    directory: Path | None = None,
    timeout: float = 60.0,
    progress=print,
    engine_args: list[str] | None = None,
    engine: str = "emulator",
    wait_nodes: float = WAIT_NODES_SECONDS,
    before_start: Callable[[], None] | None = None,
) -> LocalState:
    """This node's part of `profile` on a cluster of NODES>1 (polarstack.stack.cluster's layout), every listener on
    the node's cluster address:
    - every node: its ENGINE_COUNT emulated engines on the profile's ports, and Ray with the token
      (ray_auth.process_env): rank 0 the head (GCS on RAY_GCS_PORT, dashboard on RAY_DASHBOARD_PORT), the others a
      worker that waits for the head, joins it and waits until the head lists it ALIVE;
    - rank 0 also: waits for every other node's engines (GET /health at cluster.engine_urls, `wait_nodes` s), starts
      the router in front of all of them by their cluster address (static: --worker-urls; register: POST /workers,
      as slime does), then waits until the Ray cluster has NODES alive nodes.
    The token file: rank 0 writes it when missing (ray_auth.ensure); the others need a copy (ray_auth.check)."""
    _refuse_node_request(profile, cluster, engine)
    host = cluster.bind_host()  # checks that CLUSTER_IFACE holds this node's address
    path = ray_auth.token_path(cluster.token_file)
    if not cluster.head:
        ray_auth.check(path)  # the head's copy must be here before anything starts
    nodes = cluster_layout.layout(profile, cluster)
    mine = nodes[cluster.rank]
    all_urls = [url for node in nodes for url in node.engine_urls]
    gcs_port = int(profile.setting("RAY_GCS_PORT", "6379"))  # the profile's stack settings, resolved when it loaded
    dashboard_port = int(profile.setting("RAY_DASHBOARD_PORT", "8265"))
    dashboard = f"http://{cluster.head_addr}:{dashboard_port}"
    release = profile.router
    router_url = f"http://{cluster.head_addr}:{profile.router_port}" if release is not None else None
    ports = [profile.engine_port(i) for i in range(profile.engine_count)]
    _check_node_ports(profile, cluster, host, ports, gcs_port, dashboard_port)
    directory = directory or run_dir()
    if before_start is not None:  # (`up`'s): every check above passed, nothing written yet
        refuse_if_up(directory)
        before_start()
    token_file = ray_auth.prepare(path, head=cluster.head)  # rank 0 writes it when missing
    state = _fresh_state(
        directory,
        {
            **_base_state(profile, engine),
            "cluster": cluster.as_dict(),
            "nodes": [node.as_dict() for node in nodes],
            "ray_dashboard": dashboard,
            "ray_gcs": f"{cluster.head_addr}:{gcs_port}",
            "token_file": str(token_file),  # the path only; the token is never written anywhere else
        },
    )
    began = time.monotonic()
    try:
        if release is not None and cluster.head:
            install(release)
        bin_dir, _seconds = ray_head.install()
        _launch_engines(state, profile, profile.engine_count, engine, engine_args, timeout, progress, host, ports)
        ray_timeout = max(timeout, RAY_READY_SECONDS)
        logs = directory / "logs"
        process, log_path = _start_ray_process(
            state, cluster, host, gcs_port, dashboard_port, dashboard, token_file, bin_dir, logs, wait_nodes
        )
        if cluster.head:
            ray_node.wait_head(dashboard, token_file, ray_timeout, process, log_path)
            progress(f"up: Ray head on {host}:{gcs_port} (dashboard :{dashboard_port}), token from {token_file}")
            others = {url: node for node in nodes if node.rank != cluster.rank for url in node.engine_urls}
            wait_engines(others, wait_nodes)
            progress(f"up: the engines of node(s) {', '.join(str(n.rank) for n in nodes[1:])} answer")
            if release is not None:
                _start_router(state, profile, release, all_urls, profile.router_port, timeout, progress, host)
            alive = ray_node.wait_nodes(dashboard, token_file, list(cluster.addrs), wait_nodes, process, log_path)
        else:
            alive = ray_node.wait_nodes(dashboard, token_file, [host], ray_timeout, process, log_path)
        progress(
            f"up: node {mine.rank} of {cluster.nodes} ({mine.addr}): "
            f"{', '.join(entry['role'] for entry in state.processes)} in {time.monotonic() - began:.0f} s; "
            f"the Ray cluster lists {len(alive)} alive node(s)"
        )
        state.data["base_url"] = polar_base_url(profile, router_url, all_urls)
        state.data["engine_urls"] = all_urls
        _save(state)
        return state
    except BaseException:
        with shielded():
            _stop_all(state.processes)
            state.path.unlink(missing_ok=True)
        raise


def _refuse_node_request(profile: Profile, cluster: Cluster, engine: str) -> None:
    """USAGE for a profile the cluster layout cannot spread over the nodes, or engines other than the emulator."""
    refused = cluster_layout.refusal(profile, cluster)
    if refused:
        raise StackError(refused, ExitCode.USAGE)
    if engine != "emulator":
        raise StackError(
            f"at NODES={cluster.nodes} the local runtime runs emulated engines only; drop ENGINE={engine} (the real "
            "engines across nodes are the docker runtime's).",
            ExitCode.USAGE,
        )


def _check_node_ports(
    profile: Profile, cluster: Cluster, host: str, ports: list[int], gcs_port: int, dashboard_port: int
) -> None:
    """Every fixed port this node will listen on is free on `host`: its engines', and on rank 0 Ray's head and the
    router's."""
    for index, port in enumerate(ports):
        check_port_free(host, port, f"engine-{index}", f"ENGINE_PORT_BASE ({profile.path.name})")
    if cluster.head:
        check_port_free(host, gcs_port, "the Ray head's GCS", "RAY_GCS_PORT (configs/stack.env)")
        check_port_free(host, dashboard_port, "the Ray dashboard", "RAY_DASHBOARD_PORT (configs/stack.env)")
        if profile.router is not None:
            check_port_free(host, profile.router_port, "the router", f"ROUTER_PORT ({profile.path.name})")


def _start_ray_process(
    state: LocalState,
    cluster: Cluster,
    host: str,
    gcs_port: int,
    dashboard_port: int,
    dashboard: str,
    token_file: Path,
    bin_dir: Path,
    logs: Path,
    wait_nodes: float,
) -> tuple[subprocess.Popen, Path]:
    """This node's Ray: on rank 0 the head, on the others a worker once the head answers (`ray start --address`
    needs it); recorded in the run state. Returns the process and its log."""
    if cluster.head:
        command = ray_node.head_line(host, gcs_port, dashboard_port)
        role, log_path = "ray-head", logs / "ray-head.log"
    else:
        ray_node.wait_head(dashboard, token_file, wait_nodes)  # the head first: `ray start --address` needs it
        command = ray_node.worker_line(cluster.head_addr, gcs_port, host)
        role, log_path = "ray-worker", logs / "ray-worker.log"
    temp_dir = ray_node.short_temp_dir()
    try:
        process = ray_node.spawn(
            command, bin_dir=bin_dir, env=ray_node.ray_env(token_file, bin_dir, temp_dir), log_path=log_path
        )
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    url = dashboard if cluster.head else f"ray://{host}"
    state.processes.append(ray_node.entry(role, process, command, url, log_path, temp_dir))
    _save(state)
    return process, log_path


def _start_router(
    state: LocalState,
    profile: Profile,
    release: Any,
    engine_urls: list[str],
    port: int,
    timeout: float,
    progress,
    host: str = LOOPBACK,
) -> str:
    """Start the profile's router on `host`:`port` in front of `engine_urls` (static: --worker-urls; register:
    POST /workers once it answers, as slime does), recorded in `state`; its URL."""
    prom = free_port()  # its metrics endpoint stays on loopback (RouterRelease.launch_args)
    static = engine_urls if profile.registration == "static" else []
    cmd = [str(install(release)), *release.launch_args(port, static, prom, profile.router_args, host=host)]
    log_path = state.path.parent / "logs" / "router.log"
    process = _spawn(cmd, log_path)
    router_url = f"http://{host}:{port}"
    state.processes.append(
        {
            "role": "router",
            "pid": process.pid,
            "port": port,
            "cmd": cmd[1:],
            "start_time": start_time(process.pid),
            "url": router_url,
            "log": str(log_path),
            "release": release.spec,
        }
    )
    _save(state)
    try:
        wait_http(router_url, timeout, process)
    except StackError as exc:
        tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
        raise StackError(f"{release.spec} did not start: {exc.message} {tail}", ExitCode.ENVIRONMENT) from None
    if profile.registration == "register":
        worker_api.register_all(router_url, engine_urls, timeout)
    where = "" if host == LOOPBACK else f"{host}:"
    progress(f"up: {release.spec} on {where}{port} ({profile.registration} registration)")
    return router_url


def _save(state: LocalState) -> None:
    tmp = state.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.data, indent=2))
    tmp.replace(state.path)


def _stop_all(entries: list[dict[str, Any]], router_timeout: float = 10.0) -> list[int]:
    """Stop the entries we own (never a shared one): the router first, then a Ray node's session (NODES>1), then the
    engines, all at once (a real sglang server takes seconds to stop its scheduler and detokenizer: one after the
    other, two took twice as long)."""
    own = [
        entry
        for entry in reversed(entries)
        if not entry.get("shared") and (_owned(entry) or (entry.get("session") and session_pids(entry["pid"])))
    ]
    for entry in own:
        if entry.get("role") == "router":
            stop_pid(entry["pid"], timeout=router_timeout)
    for entry in own:
        if entry.get("session"):  # `ray start --block` and everything it started, by its session
            ray_node.stop_session(entry)
    for entry in entries:  # a Ray node's temp dir (sockets, session logs), whether or not its processes survived
        if entry.get("temp_dir") and not entry.get("shared"):
            shutil.rmtree(entry["temp_dir"], ignore_errors=True)
    engines = [entry for entry in own if entry.get("role") != "router" and not entry.get("session")]

    def stop(entry: dict[str, Any]) -> None:
        if entry.get("engine"):  # a real sglang server: its scheduler and detokenizer go with it
            real_sglang.stop_tree(entry["pid"])
        else:
            stop_pid(entry["pid"])

    if len(engines) > 1:
        with ThreadPoolExecutor(len(engines)) as pool:
            list(pool.map(stop, engines))
    else:
        for entry in engines:
            stop(entry)
    return [entry["pid"] for entry in own]


def down(*, directory: Path | None = None, router_timeout: float = 10.0) -> tuple[str | None, list[int]]:
    """Stop what `up` recorded; (profile or None when nothing was up, pids stopped). `router_timeout`: seconds
    before a router still draining on SIGTERM is killed (`make demo`, whose smoke has ended, waits less).

    Survives further Ctrl-C / SIGTERM while it stops processes (they are deferred until it is done)."""
    with shielded():
        state = read_state(directory)
        if state is None:
            return None, []
        stopped = _stop_all(state.processes, router_timeout)
        state.path.unlink(missing_ok=True)
        return state.data.get("profile"), stopped


def demo_dir() -> Path:
    """Where `polarstack demo` keeps each profile's run state (under the run dir, so `down` finds orphans)."""
    return run_dir() / "demo"


def down_all() -> list[tuple[str, list[int]]]:
    """`polarstack down`: stop the stack `up` recorded and any a killed `demo` left behind; (profile, pids)."""
    done = []
    for directory in [run_dir(), *sorted(p.parent for p in demo_dir().glob(f"*/{STATE_FILE}"))]:
        profile, pids = down(directory=directory)
        if profile is not None:
            done.append((profile, pids))
    return done
