"""`make demo RUNTIME=docker`: every profile in turn through the Docker runtime (DEVICE=cpu), the same table as
`make demo`: real sglang in engine containers built from images/engine/Dockerfile, the real router wheels in
router containers, the smoke run inside the trainer container as `make smoke` runs it.

The profiles differ in their router (and the trainer's rendered environment), not in their engines, so the engines
start once: per profile only the router and the trainer are (re)created under the same Compose project
(`compose up --no-deps --wait router trainer`; engine-direct removes the router), and what would carry over from the
previous profile is reset first: the router's registrations go with its container (a new one starts empty and the
smoke registers the engines as slime does), the real engine keeps no request log, and its prefix (radix) cache is
emptied with sglang's `POST /flush_cache` on every engine. Every other step is the node's code path: the rendered
Compose files (compose.yaml + compose.cpu.yaml), the healthchecks, the run-state record, `docker_smoke`.

The demo's stack is its own Compose project (DEMO_PROJECT), run-state record and ports (DEMO_PORTS), so it never
touches a user's `make up DEVICE=cpu` stack; it is always taken down at the end, also after Ctrl-C.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any, Callable

import httpx

from polarstack.checks import docker_smoke
from polarstack.checks.demo import row_as_expected
from polarstack.checks.smoke_inputs import SmokeOptions
from polarstack.errors import ExitCode, StackError
from polarstack.processes import shielded
from polarstack.stack import bases, compose, device, docker_state, dockerd, profiles, real_sglang
from polarstack.stack.resolved import Resolved, reread
from polarstack.stack.runtime import DockerRuntime

DEMO_PROJECT = "polarstack-demo"
DEMO_PORTS = {
    "ENGINE_PORT_BASE": "32000",
    "ROUTER_PORT": "32080",
    "RAY_GCS_PORT": "32379",
    "RAY_DASHBOARD_PORT": "32265",
}
NO_ENGINE = (
    "make demo RUNTIME=docker needs a Docker engine at DOCKER_HOST (or the default socket) and none answers: start "
    "this project's private one with `make dockerd` and export the DOCKER_HOST=... line it prints."
)


def _environment(project: str | None) -> None:
    """DEVICE=cpu, the demo's own project (`project`: POLARSTACK_DEMO_PROJECT as the CLI read it, else DEMO_PROJECT)
    and ports (the caller's environment still wins for the ports), for Compose and the settings read below."""
    os.environ[device.DEVICE_ENV] = "cpu"
    os.environ["POLARSTACK_CPU_PROJECT"] = project or DEMO_PROJECT
    for key, value in DEMO_PORTS.items():
        os.environ.setdefault(key, value)
    device.apply_cpu_defaults()


def check_engine(docker_host: str | None) -> None:
    """`docker_host`: DOCKER_HOST as the CLI read it (the engine every docker and Compose command here talks to)."""
    if not dockerd.answers(docker_host or "unix:///var/run/docker.sock"):
        raise StackError(NO_ENGINE, ExitCode.ENVIRONMENT)


def _compose(profile, args: list[str], progress: Callable[[str], None], where: Resolved) -> None:
    proc = compose.run_compose(profile, args, where=where, capture=True)
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()][-3:]
        raise StackError(
            f"docker compose {' '.join(args[:2])} failed for profile {profile.name}: {' | '.join(tail)[:400]}",
            ExitCode.ENVIRONMENT,
        )


# The options `make smoke` runs with by default against the real CPU engines (cli.main: the target's timeout).
SMOKE_OPTIONS = SmokeOptions(timeout=real_sglang.SMOKE_TIMEOUT)


def flush_caches(profile) -> None:
    """Empty each engine's prefix cache (sglang's POST /flush_cache) so a profile starts from cold engines."""
    for url in profiles.docker_engine_urls(profile):
        try:
            httpx.post(f"{url}/flush_cache", timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            raise StackError(
                f"{url}/flush_cache failed ({exc}); the engine stopped answering.", ExitCode.UNREACHABLE
            ) from None


# What the demo keeps from one profile to the next (docker_state.demo_owner): the engines, and the trainer container,
# which Compose recreates only when the profile changes its configuration; the router is each profile's own.
SHARED_SERVICES = ["engine-0", "engine-1", "trainer"]


def run_profile(
    profile, progress: Callable[[str], None], flush: bool, where: Resolved, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One profile's row: its router and trainer swapped in on the shared engines, its smoke in the trainer. `where`:
    the demo's DEVICE=cpu project (run_demo)."""
    release = profile.router
    row: dict[str, Any] = {
        "profile": profile.name,
        "engine": f"{real_sglang.spec()} (container)",
        "role": profile.role,
        "router": release.spec if release else "none",
        "expected": profile.expect,
    }
    started = time.perf_counter()
    try:
        if flush:  # the previous profile's prefix cache must not make this one's first answers warm
            flush_caches(profile)
        # The previous profile's router goes first (a new router container: no registration carries over); then
        # only the shared services run, which the guard lets this demo, and nobody else, swap profiles on.
        _compose(profile, ["rm", "--stop", "--force", "router"], progress, where)
        docker_state.guard_other_profile("up", profile, where, demo=owner)
        services = ["up", "--detach", "--wait", "--no-deps", *(["router"] if release else []), "trainer"]
        _compose(profile, services, progress, where)
        record = device.tool_record(release)
        docker_state.write(profile, extra=record, cpu=where.cpu, demo=owner)
        row["up_seconds"] = round(time.perf_counter() - started, 3)
        # the demo's own DEVICE=cpu project (_environment), as the trainer's smoke is run there
        report = docker_smoke.run_in_trainer(SMOKE_OPTIONS, profile, DockerRuntime(where), record=record)
        row.update(
            verdict="pass" if report["verdict"] == "pass" else report["code"],
            trainable_tokens=report.get("trainable_tokens", 0),
            smoke_seconds=report.get("elapsed_seconds"),
            message=report["message"],
            fields_missing=report.get("fields_missing", []),
        )
    except StackError as exc:  # a profile that cannot come up or whose smoke errs is a row, not a crash
        row.update(verdict=exc.code.name, trainable_tokens=0, smoke_seconds=None, message=exc.message)
    row["as_expected"] = row_as_expected(row)
    return row


def teardown(profile, where: Resolved) -> None:
    with shielded():
        compose.run_compose(profile, ["down", "--remove-orphans"], where=where, capture=True)
        docker_state.clear(cpu=where.cpu)


def run_demo(
    names: list[str] | None,
    progress: Callable[[str], None],
    *,
    site: Resolved,
    docker_host: str | None,
    project: str | None,
) -> dict[str, Any]:
    """Every profile through Docker; the rows and the closing note's figures (times, disk, memory). `site`: the
    CLI's; `docker_host` and `project`: DOCKER_HOST and POLARSTACK_DEMO_PROJECT as the CLI read them."""
    check_engine(docker_host)
    _environment(project)
    # The demo's own DEVICE=cpu project, set by _environment (a stack of its own, whatever the site's device): the
    # site's cluster, the device cpu and the run state of that project, read now (stack.resolved.reread).
    where = reread(site, cpu=True)
    started = time.perf_counter()
    order = names or list(profiles.PROFILE_ORDER)
    two_engines = next(n for n in profiles.PROFILE_ORDER if profiles.load(n).engine_count == 2)
    base = profiles.load(two_engines)
    cold = not all(bases.exists(ref) for ref in (bases.python_base(), ":".join(bases.engine_base())))
    progress("demo: the CPU bases, the tiny model and the images (cached after the first run)")
    device.prepare(progress)
    _compose(base, ["build"], progress, where)  # every image once (Compose's cache makes a warm build quick) ...
    for name in order:  # ... and each other profile's router release
        if name != two_engines and profiles.load(name).router is not None:
            _compose(profiles.load(name), ["build", "router"], progress, where)
    build_seconds = time.perf_counter() - started
    sampler = MemorySampler()
    rows: list[dict[str, Any]] = []
    try:
        # The engines once, under a two-engine profile so engine-1 exists for every profile: the same `up --wait`
        # as `make up`, healthchecks included.
        owner = docker_state.demo_owner(SHARED_SERVICES)
        # A user's stack of this device (or another demo's) is up: refused, whichever profile it is.
        recorded = docker_state.guard_other_profile("up", base, where, demo=owner)
        if recorded is not None and docker_state.service_states(base, where):
            raise StackError(
                f"profile {base.name} is up under Docker ({device.project(where.cpu)}); `make down` it first, then "
                "`make demo RUNTIME=docker`.",
                ExitCode.STATE,
            )
        progress("demo: engines up (once for every profile)")
        # With their dependency: model-download checks the bound model and makes its mount point in the volume.
        _compose(base, ["up", "--detach", "--wait", "engine-0", "engine-1"], progress, where)
        progress(f"demo: engines healthy after {time.perf_counter() - started - build_seconds:.0f} s")
        for index, name in enumerate(order):
            progress(f"demo: {name}")
            rows.append(run_profile(profiles.load(name), progress, flush=index > 0, where=where, owner=owner))
    finally:
        sampler.stop()
        teardown(base, where)
    return {
        "rows": rows,
        "cold": cold,
        "elapsed_seconds": round(time.perf_counter() - started, 1),
        "build_seconds": round(build_seconds, 1),
        "peak_memory_bytes": sampler.peak,
        "data_root_bytes": dockerd.data_root_bytes() if _private(docker_host) else None,
    }


def _private(host: str | None) -> bool:
    return bool(host) and host == dockerd.daemon().host


class MemorySampler:
    """The peak of the machine's used memory (MemTotal - MemAvailable), sampled every second in a thread."""

    def __init__(self, interval: float = 1.0) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(interval)

    def sample(self) -> None:
        try:
            with open("/proc/meminfo") as handle:
                fields = dict(line.split(":", 1) for line in handle.read().splitlines())
            used = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
        except (OSError, KeyError, ValueError):
            return
        self.peak = max(self.peak, used * 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def containers_of(project: str) -> list[str]:
    proc = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    )
    return [line for line in proc.stdout.splitlines() if line.strip()]
