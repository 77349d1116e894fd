"""Router releases (sglang-router, smg) and a harness that runs a real one on loopback.

The catalog encodes what ../shared/reference/router-behavior.md measured with the real PyPI wheels:
which launch module a package uses, which flags a release accepts, and whether it exposes the worker API
slime registers engines through (`POST /workers`) and current Polar discovers workers with (`GET /workers`).
Unmeasured releases get the rule of their neighbours and are marked `measured=False`.

The harness installs a release into its own cached virtual environment (reused across runs), starts it
on 127.0.0.1 with its own `--prometheus-port` (two routers on the default 29000 collide: the second one
panics), waits until it answers `GET /health`, and stops exactly the process it started, by pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from polarstack.cache import cache_dir
from polarstack.errors import ExitCode, StackError
from polarstack.processes import child_env, free_port, stop_pid, wait_http

PACKAGES = ("sglang-router", "smg")
LAUNCH_MODULES = {"sglang-router": "sglang_router.launch_router", "smg": "smg.launch_router"}

# (package, version) pairs router-behavior.md reports measurements for.
MEASURED = {
    ("sglang-router", v) for v in ("0.1.0", "0.1.4", "0.1.5", "0.1.9", "0.2.0", "0.2.3", "0.2.4", "0.3.0", "0.3.1", "0.3.2")
} | {("smg", v) for v in ("1.3.3", "1.4.0", "1.4.1", "1.5.0", "1.6.0", "1.8.0", "1.13.0")}


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class RouterRelease:
    package: str
    version: str

    def __post_init__(self) -> None:
        if self.package not in PACKAGES:
            raise StackError(f"unknown router package {self.package!r}; use one of {', '.join(PACKAGES)}.",
                             ExitCode.USAGE)
        if not self.version or not self.version[0].isdigit():
            raise StackError(f"router version {self.version!r} is not a release number.", ExitCode.USAGE)

    @classmethod
    def parse(cls, spec: str) -> "RouterRelease":
        """`PACKAGE==VERSION`, for example `sglang-router==0.1.0`."""
        package, sep, version = spec.partition("==")
        if not sep:
            raise StackError(f"router release {spec!r} must look like PACKAGE==VERSION (sglang-router==X.Y.Z or smg==X.Y.Z).",
                             ExitCode.USAGE)
        return cls(package.strip(), version.strip())

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def module(self) -> str:
        return LAUNCH_MODULES[self.package]

    @property
    def measured(self) -> bool:
        return (self.package, self.version) in MEASURED

    @property
    def v(self) -> tuple[int, ...]:
        return version_tuple(self.version)

    # --- flags the release accepts (router-behavior.md, "Command lines that work") -----------------------
    @property
    def accepts_startup_check_interval(self) -> bool:
        # 0.1.0 rejects --worker-startup-check-interval; 0.1.4 accepts it (0.1.1-0.1.3 unmeasured).
        return self.package == "smg" or self.v >= (0, 1, 4)

    @property
    def accepts_prometheus_port(self) -> bool:
        return self.package == "smg" or self.v >= (0, 1, 5)

    @property
    def policies(self) -> tuple[str, ...]:
        """`--policy` choices of the release (its own `--help`, read 2026-11-30 for the pinned releases);
        empty when not read. docs/routing.md measures what each does with an agent workload."""
        if self.package == "smg" and self.v == (1, 13, 0):
            return ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
                    "consistent_hashing", "prefix_hash")
        if self.package == "sglang-router" and self.v == (0, 3, 2):
            return ("random", "round_robin", "cache_aware", "power_of_two", "manual")
        if self.package == "sglang-router" and self.v == (0, 1, 4):
            return ("random", "round_robin", "cache_aware")
        return ()

    @property
    def accepts_prometheus_host(self) -> bool:
        """--prometheus-host: in every release with --prometheus-port (configs/upstream/router-prometheus-host.json,
        read from each release's own parser). Its default is 0.0.0.0 from sglang-router 0.2.0 and in smg (1.13.0:
        None, bound as 0.0.0.0), so the stack always passes 127.0.0.1."""
        return self.accepts_prometheus_port

    # --- APIs ------------------------------------------------------------------------------------------
    @property
    def forwards_unknown_chat_fields(self) -> bool:
        """Do Polar's return_* chat request fields reach the engine? (the measured table's column 1)"""
        if self.package == "smg":
            return self.v >= (1, 5, 0)  # smg PR #1130, the catch-all on ChatCompletionRequest
        return self.v <= (0, 1, 4)

    @property
    def has_worker_api(self) -> bool:
        """`POST /workers` / `GET /workers` (slime's registration API; current Polar's discovery)."""
        if self.package == "smg":
            return self.v >= (1, 5, 0)
        return self.v >= (0, 3, 0)

    def launch_args(self, port: int, worker_urls: list[str], prometheus_port: int | None,
                    extra: list[str] | None = None) -> list[str]:
        args = ["-m", self.module, "--host", "127.0.0.1", "--port", str(port)]
        if worker_urls:
            args += ["--worker-urls", *worker_urls]
        if self.accepts_startup_check_interval:
            args += ["--worker-startup-check-interval", "1"]
        if self.accepts_prometheus_port and prometheus_port is not None:
            args += ["--prometheus-port", str(prometheus_port)]
        if self.accepts_prometheus_host and prometheus_port is not None:
            args += ["--prometheus-host", "127.0.0.1"]  # the metrics endpoint stays on loopback too
        return args + list(extra or [])


# --- installation --------------------------------------------------------------------------------------


def venv_dir(release: RouterRelease) -> Path:
    return cache_dir() / "routers" / f"{release.package}-{release.version}"


def venv_python(release: RouterRelease) -> Path:
    return venv_dir(release) / "bin" / "python"


def is_installed(release: RouterRelease) -> bool:
    return (venv_dir(release) / ".installed").exists()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(release: RouterRelease, *, quiet: bool = True) -> Path:
    """Install `release` into its own cached venv (once) and return that venv's python."""
    target = venv_dir(release)
    with _lock(target.parent / (target.name + ".lock")):
        if is_installed(release):
            return venv_python(release)
        if target.exists():
            shutil.rmtree(target)  # a half-finished earlier install
        if not quiet:
            print(f"polarstack: installing {release.spec} into {target} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, capture_output=True)
        proc = subprocess.run([str(venv_python(release)), "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", release.spec], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            shutil.rmtree(target, ignore_errors=True)
            raise StackError(f"could not install {release.spec} from the package index ({tail[0]}); "
                             "check that PyPI is reachable and the release has a wheel for this platform.",
                             ExitCode.ENVIRONMENT)
        (target / ".installed").write_text(release.spec + "\n")
    return venv_python(release)


# --- running ---------------------------------------------------------------------------------------------


@dataclass
class RunningRouter:
    release: RouterRelease
    port: int
    prometheus_port: int | None
    process: subprocess.Popen
    log_path: Path
    startup_seconds: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        stop_pid(self.process.pid, self.process, timeout)


def start(release: RouterRelease, worker_urls: list[str], *, port: int | None = None,
          prometheus_port: int | None = None, log_dir: Path | None = None, timeout: float = 30.0,
          extra_args: list[str] | None = None) -> RunningRouter:
    """Start `release` on 127.0.0.1 in front of `worker_urls`; returns once it answers /health."""
    python = install(release)
    port = port or free_port()
    if release.accepts_prometheus_port and prometheus_port is None:
        prometheus_port = free_port()
    log_dir = log_dir or (cache_dir() / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"router-{release.package}-{release.version}-{port}.log"
    env = child_env()
    env["RUST_LOG"] = env.get("RUST_LOG", "warn")
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(python), *release.launch_args(port, worker_urls, prometheus_port, extra_args)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    router = RunningRouter(release, port, prometheus_port, process, log_path)
    try:
        router.startup_seconds = wait_http(router.url, timeout, process, path="/health")
    except StackError as exc:
        tail = router.log_tail()
        router.stop()
        raise StackError(f"{release.spec} did not start on {router.url}: {exc.message}"
                         + (f" Last log lines: {tail}" if tail else ""), ExitCode.ENVIRONMENT) from None
    return router


def register_worker(router_url: str, worker_url: str, timeout: float = 10.0) -> None:
    """Register an engine the way slime does: POST /workers {"url", "worker_type": "regular"} (within `timeout`
    seconds in total: the training gate registers engines through here)."""
    from polarstack.http import client, request

    with client(timeout) as http:
        try:
            reply = request(http, "POST", f"{router_url}/workers", {"url": worker_url, "worker_type": "regular"})
        except StackError as exc:
            raise StackError(f"could not register {worker_url} with the router at {router_url}: {exc.message}",
                             exc.code) from None
    if not 200 <= reply.status < 300:
        raise StackError(f"the router at {router_url} refused POST /workers for {worker_url} "
                         f"(HTTP {reply.status}: {reply.body[:200].decode('utf-8', 'replace')}); it has no "
                         "slime-compatible worker API.", ExitCode.HTTP_ERROR)
