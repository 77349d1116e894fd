"""Router releases (sglang-router, smg): an installer and a harness that runs a real one on loopback.

What each release accepts (flags, policies, the worker API) is the catalog, polarstack.routers.catalog; its names
are re-exported here for existing imports. Registering engines with a running router is polarstack.routers.worker_api.

The harness installs a release into its own cached virtual environment (reused across runs), starts it
on 127.0.0.1 with its own `--prometheus-port` (two routers on the default 29000 collide: the second one
panics), waits until it answers `GET /health`, and stops exactly the process it started, by pid.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir
from polarstack.processes import (
    Served,
    announced_install,
    child_env,
    file_lock,
    free_port,
    startup_seconds,
    stop_pid,
    wait_http,
)

# The catalog, re-exported: callers and tests import these names from polarstack.routers.harness too.
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.worker_api import register

# --- installation --------------------------------------------------------------------------------------


def venv_dir(release: RouterRelease) -> Path:
    return cache_dir() / "routers" / f"{release.package}-{release.version}"


def venv_python(release: RouterRelease) -> Path:
    return venv_dir(release) / "bin" / "python"


def is_installed(release: RouterRelease) -> bool:
    return (venv_dir(release) / ".installed").exists()


def install(release: RouterRelease) -> Path:
    """Install `release` into its own cached venv (once, announced with its time) and return that venv's python."""
    target = venv_dir(release)
    with file_lock(target.parent / (target.name + ".lock")):
        if is_installed(release):
            return venv_python(release)
        if target.exists():
            shutil.rmtree(target)  # a half-finished earlier install
        with announced_install(release.spec, target, "once, cached for later runs"):
            subprocess.run(
                [sys.executable, "-m", "venv", str(target)], check=True, capture_output=True, env=child_env()
            )
            proc = subprocess.run(
                [
                    str(venv_python(release)),
                    *("-m", "pip", "install", "--quiet", "--disable-pip-version-check", release.spec),
                ],
                capture_output=True,
                text=True,
                env=child_env(),
            )
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                shutil.rmtree(target, ignore_errors=True)
                raise StackError(
                    f"could not install {release.spec} from the package index ({tail[0]}); "
                    "check that PyPI is reachable and the release has a wheel for this platform.",
                    ExitCode.ENVIRONMENT,
                )
            (target / ".installed").write_text(release.spec + "\n")
    return venv_python(release)


# --- running ---------------------------------------------------------------------------------------------


@dataclass
class RunningRouter(Served):
    release: RouterRelease
    port: int
    prometheus_port: int | None
    process: subprocess.Popen
    log_path: Path
    startup_seconds: float = 0.0

    def stop(self, timeout: float = 10.0) -> None:
        stop_pid(self.process.pid, self.process, timeout)


def start(
    release: RouterRelease,
    worker_urls: list[str],
    *,
    port: int | None = None,
    prometheus_port: int | None = None,
    log_dir: Path | None = None,
    timeout: float | None = None,
    extra_args: list[str] | None = None,
) -> RunningRouter:
    """Start `release` on 127.0.0.1 in front of `worker_urls`; returns once it answers /health.

    Ports this function chose itself (free_port) can be taken by another process between the choice and the router's
    bind (seen once in `make test`: sglang-router 0.1.9's metrics exporter, "Address already in use"); such a start is
    retried on fresh ports, at most PORT_RACE_ATTEMPTS times. Ports the caller passed are never changed. `timeout`
    None: processes.startup_seconds(ROUTER_START_SECONDS), the machine's rule (issue 34 point 2)."""
    if timeout is None:
        timeout = startup_seconds(ROUTER_START_SECONDS)
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        chosen = (port or free_port(), prometheus_port)
        if release.accepts_prometheus_port and prometheus_port is None:
            chosen = (chosen[0], free_port())
        try:
            return _start(release, worker_urls, chosen[0], chosen[1], log_dir, timeout, extra_args)
        except _PortTaken:
            if attempt == PORT_RACE_ATTEMPTS or (port is not None and prometheus_port is not None):
                ports = f"HTTP {chosen[0]}" + (f", metrics {chosen[1]}" if chosen[1] is not None else "")
                raise StackError(
                    f"{release.spec} exited with a port already in use ({ports}, attempt {attempt}); free that port "
                    "or pass other ones.",
                    ExitCode.ENVIRONMENT,
                ) from None
    raise AssertionError("unreachable")


PORT_RACE_ATTEMPTS = 3
# What a router needs to answer /health and list its models on a quiet machine, with a margin (the base of the rule).
ROUTER_START_SECONDS = 30.0


class _PortTaken(Exception):
    """The router exited because a port it was given was bound by another process in the meantime."""


def _start(
    release: RouterRelease,
    worker_urls: list[str],
    port: int,
    prometheus_port: int | None,
    log_dir: Path | None,
    timeout: float,
    extra_args: list[str] | None,
) -> RunningRouter:
    python = install(release)
    log_dir = log_dir or (cache_dir() / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"router-{release.package}-{release.version}-{port}.log"
    env = child_env()
    env["RUST_LOG"] = env.get("RUST_LOG", "warn")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(python), *release.launch_args(port, worker_urls, prometheus_port, extra_args)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    router = RunningRouter(release, port, prometheus_port, process, log_path)
    try:
        router.startup_seconds = wait_http(router.url, timeout, process, path="/health")
    except StackError as exc:
        tail = router.log_tail()
        router.stop()
        if process.poll() is not None and "Address already in use" in log_path.read_text(errors="replace"):
            raise _PortTaken() from None
        raise StackError(
            f"{release.spec} did not start on {router.url}: {exc.message}"
            + (f" Last log lines: {tail}" if tail else ""),
            ExitCode.ENVIRONMENT,
        ) from None
    if worker_urls and release.package == "smg":
        # smg answers /health before it has registered the --worker-urls it was given (measured with smg 1.4.1: /health
        # 200 while /v1/models said 503 "No models available" until the worker's registration ended; a smoke sent in
        # between got 404 "No worker available for model 'default'", seen in a cold CI run's real-engine tier).
        began = time.monotonic()
        if not _lists_models(router.url, max(timeout - router.startup_seconds, 1.0), process):
            tail = router.log_tail()
            router.stop()
            raise StackError(
                f"{release.spec} on {router.url} answered /health but registered none of {', '.join(worker_urls)} "
                "within the start timeout (GET /v1/models never listed a model); check that the engines answer."
                + (f" Last log lines: {tail}" if tail else ""),
                ExitCode.ENVIRONMENT,
            )
        router.startup_seconds += time.monotonic() - began
    return router


def _lists_models(router_url: str, timeout: float, process: subprocess.Popen) -> bool:
    """Poll GET /v1/models until it answers 200 with at least one model, the process exits, or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            reply = httpx.get(f"{router_url}/v1/models", timeout=5, trust_env=False)
            if reply.status_code == 200 and (reply.json().get("data") or []):
                return True
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        time.sleep(0.25)
    return False


def register_worker(router_url: str, worker_url: str, timeout: float = 10.0) -> None:
    """polarstack.routers.worker_api.register, under its older name (tests and callers import it from here)."""

    register(router_url, worker_url, timeout)
