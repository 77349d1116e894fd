"""Shared fixtures: engine emulators and real routers on 127.0.0.1, each stopped by its own pid."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import bundled_verifier
import fixture_failures
import tier_deps
from polarstack import paths
from polarstack.errors import ExitCode, StackError
from polarstack.processes import startup_seconds, stop_pid
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.harness import RunningRouter
from polarstack.routers.harness import start as start_router
from polarstack.stack import dockerd
from polarstack.stack.engines import stack_parser, start_emulator
from polarstack.stack.profiles import stack_settings

# pytest finds hooks by name in this module: one report per failed shared fixture (tests/fixture_failures.py).
pytest_runtest_makereport = fixture_failures.pytest_runtest_makereport

# The emulator's response faults that block training and the smoke's exit code for each (README, "Failure modes
# and exit codes"): the verdict is Polar's own (polarstack.polar.model).
FAULT_EXIT_CODES = [
    ("no_extensions", ExitCode.TOKENS_MISSING),
    ("http500", ExitCode.HTTP_ERROR),
    ("html", ExitCode.HTTP_ERROR),
    ("truncated", ExitCode.MALFORMED),
    # sglang writes a NaN logprob as null; a null invalidates meta_info's whole list, so Polar extracts nothing.
    ("nan_logprobs", ExitCode.INVARIANT),
    # not sglang: a NaN literal, which Polar's orjson parser rejects (the request fails, nothing is recorded).
    ("nan_literal_logprobs", ExitCode.MALFORMED),
]
# Faults Polar trains through: the smoke passes with these warnings (finding codes), and --strict exits 4.
FAULT_WARNINGS = [
    ("positive_logprobs", {"positive_logprob"}),
    ("length_mismatch", {"usage_mismatch", "aligned_prefix"}),
]


@dataclass
class Engine:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, path: str = "/v1/chat/completions") -> list[dict]:
        return httpx.get(f"{self.url}/_emulator/requests", params={"path": path}).json()["requests"]

    def clear(self) -> None:
        httpx.delete(f"{self.url}/_emulator/requests")

    def fault(self, mode: str, **extra) -> None:
        httpx.post(f"{self.url}/_emulator/fault", json={"mode": mode, **extra}).raise_for_status()


@pytest.fixture(autouse=True)
def _no_machine_memory(monkeypatch) -> None:
    """No test reads this machine's GPUs or host memory (polarstack.train.memory): plans see no GPU, so
    GPU_MEMORY_GB's default (140) and no host figure, on any machine; tests/fake_node.py installs its own."""
    monkeypatch.setenv("POLARSTACK_NVIDIA_SMI", "polarstack-test-no-nvidia-smi")
    monkeypatch.setenv("POLARSTACK_PROC_MEMINFO", "/nonexistent/polarstack-test-meminfo")
    for knob in ("GPU_MEMORY_GB", "HOST_MEMORY_GB"):
        monkeypatch.delenv(knob, raising=False)


@pytest.fixture(scope="session", autouse=True)
def ray_token_file(tmp_path_factory) -> Iterator[Path]:
    """No test writes or reads the user's Ray token (~/.config/polarstack/ray-auth-token): RAY_AUTH_TOKEN_FILE names a
    file under the session's temporary directory (polarstack.stack.ray_auth writes it at the first `up`). Session
    scope, so that module fixtures which render the stack see it too."""
    path = tmp_path_factory.mktemp("ray-token") / "ray-auth-token"
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_AUTH_TOKEN_FILE", str(path))
    try:
        yield path
    finally:
        patch.undo()


# A Ray head's start (ray_head.start's own default, 10-30 s measured quiet), at most 240 s: under pytest's 300 s per test.
RAY_START_SECONDS, RAY_START_CEILING = 120.0, 240.0
# A harness head's session gets the CPU share of nice -10 where the kernel's autogroup applies (ray_head.start's
# session_nice): started beside the suite's other busy sessions, its client server's fixed 30-s wait for the raylet
# expired at load 10-23 on 2 cores (docs/test-times.md, the 598b517 and 4d00652 rows).
RAY_SESSION_NICE = -10
# What a stand-in engine or a router needs to answer on a quiet machine, with a margin (about 1 s measured); the wait
# is polarstack.processes.startup_seconds of it: longer on a loaded machine (issue 34 point 2).
START_SECONDS = 30.0


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:]) or f"({path} is empty)"


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Iterator[Engine]:
    """One emulator for read-only tests (tests must not change its fault mode). A failed start fails the first test
    that asks for it with the emulator's log; the later ones get one line pointing at it (fixture_failures.py)."""
    log_path = tmp_path_factory.mktemp("engine") / "emulator.log"
    timeout = startup_seconds(START_SECONDS)
    try:
        # the stack's tool-call parser, as the engines run it
        process, port = start_emulator(
            seed=0, log_path=log_path, timeout=timeout, tool_call_parser=stack_parser(stack_settings())
        )
    except StackError as exc:
        pytest.fail(
            f"the shared emulator (fixture engine) did not start within {timeout:.0f} s: {exc.message}\n"
            f"its log {log_path}:\n{log_tail(log_path)}",
            pytrace=False,
        )
    try:
        yield Engine(process, port)
    finally:
        stop_pid(process.pid, process)


@pytest.fixture
def engine_factory() -> Iterator:
    """Start private emulators (for fault injection); all stopped at the end of the test."""
    started: list[Engine] = []

    def make(**kwargs) -> Engine:
        kwargs.setdefault("timeout", startup_seconds(START_SECONDS))
        kwargs.setdefault("tool_call_parser", stack_parser(stack_settings()))  # the stack's, as the engines run it
        process, port = start_emulator(**kwargs)
        started.append(Engine(process, port))
        return started[-1]

    yield make
    for item in started:
        stop_pid(item.process.pid, item.process)


@pytest.fixture
def router_factory() -> Iterator:
    """Start real router releases in front of engines; all stopped by pid at the end of the test."""
    started: list[RunningRouter] = []

    def make(spec: str, worker_urls: list[str], **kwargs) -> RunningRouter:
        kwargs.setdefault("timeout", startup_seconds(START_SECONDS))  # a failed start names the router's log lines
        started.append(start_router(RouterRelease.parse(spec), worker_urls, **kwargs))
        return started[-1]

    yield make
    for router in started:
        router.stop(timeout=2.0)  # smg drains for ~5 s on SIGTERM; tests need not wait


@pytest.fixture(scope="session")
def ray_bin() -> Path:
    """The pinned Ray (ray[default]==RAY_VERSION) in a venv under a cache path of at least LONG_CACHE_CHARS
    characters: `make test-deps` (tests/tier_deps.py) installs it before pytest starts, so here it is found done; run
    without it, the first test that asks installs it (under its lock, so parallel workers share one install)."""
    bin_dir = tier_deps.install_ray_long()
    assert str(bin_dir).startswith(str(tier_deps.long_cache_path(paths.cache_dir())))
    return bin_dir


# The files holding the suite's slowest tests, slowest first (measured with `pytest --durations=0` under `make test`,
# issue 27): collected first, so that pytest-xdist hands them out at the start (`make test` passes --maxschedchunk 2)
# and the short tests fill the workers at the end, instead of one heavy test running alone after all the others.
HEAVY_FIRST = (
    "tests/integration/test_exposure.py",  # the Ray head
    "tests/integration/test_matrix.py",
    "tests/sandbox/test_verifier_call_pattern.py",
    "tests/integration/test_load.py",
    "tests/integration/test_retokenized.py",
    "tests/integration/test_run_state.py",
    "tests/integration/test_local_runtime.py",
    "tests/integration/test_routing_workload.py",
    "tests/integration/test_registration.py",
    "tests/sandbox/test_verifier.py",
    "tests/integration/test_demo_engines.py",
    "tests/integration/test_verify_offline.py",
)


# pytest's per-test timeout (pyproject's `timeout`, or the test's own timeout marker) follows the same rule as the
# start-up deadlines, read when the test starts: polarstack.processes.startup_seconds of it. A fixed 300 s stopped
# the 328 sandboxed runs of test_verifier_call_pattern (35 s quiet) at load 14-19 on 2 cores.
def scaled_timeout(item) -> float | None:
    """The timeout this test gets now: its own marker's or the configured one, by the machine's rule; None for none."""
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker is not None and marker.args else marker.kwargs.get("timeout") if marker else None
    if base is None:
        base = item.config.getini("timeout") or None
    if not base or float(base) <= 0:
        return None
    return startup_seconds(float(base))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # before pytest-timeout's own wrapper reads the marker
def pytest_runtest_protocol(item, nextitem):
    timeout = scaled_timeout(item)
    if timeout is not None:
        item.add_marker(pytest.mark.timeout(timeout), append=False)  # the closest marker from now on
    yield


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: index for index, path in enumerate(HEAVY_FIRST)}
    # a stable sort: within a file, and among the files not listed, the collection order stays
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


# --- the docker tier (marker `docker`, tests/docker/): the Docker runtime on a real engine, DEVICE=cpu ------------
# It needs a Docker engine at DOCKER_HOST (or the default socket): `make dockerd` starts this project's private one,
# and `.ci/run` does. Without one the tier is skipped, naming what is missing; under CI=true (or
# POLARSTACK_REQUIRE_DOCKER=1) it fails instead, so a CI machine whose engine cannot start never passes silently.
# Here, not in a conftest.py under tests/docker/: a second module named conftest shadows this one for `from conftest import`.
def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("POLARSTACK_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def docker_engine() -> str:
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not dockerd.answers(host):
        message = (
            f"no Docker engine answers at DOCKER_HOST={host}; start this project's private one with `make dockerd` "
            "and export the DOCKER_HOST it prints"
        )
        if _required():
            pytest.fail(f"the docker tier is required here (CI=true): {message}")
        pytest.skip(message)
    return host


# --- no litter (issue 34): nothing of a run left in the temporary directory or in HOME ----------------------------
# The run gets a temporary directory of its own (TMPDIR, set before the xdist workers start, so they and every process
# a test starts inherit it): what a test, a fixture or a command leaves there is this run's, even with other runs on
# the machine. When pytest finishes, a `polarstack-*` or `ps-*` entry still there, or a new entry in HOME (its top
# level, ~/.cache, ~/.config, ~/.local) outside the project's cache, fails the run, named; the directory is then
# removed (kept when something was left, for a look).
_LITTER: dict = {}
_PROJECT_NAMES = ("polarstack-", "ps-")


@pytest.fixture(scope="session", autouse=True)
def _bundled_verifier_folder(tmp_path_factory) -> None:
    """The sandbox tests' verifier file under pytest's tmp_path_factory (tests/bundled_verifier.py)."""
    bundled_verifier.VERIFIER.factory = tmp_path_factory


def _home_entries() -> set[Path]:
    home = Path.home()
    found: set[Path] = set()
    for folder in (home, home / ".cache", home / ".config", home / ".local"):
        with contextlib.suppress(OSError):
            found.update(folder.iterdir())
    return found


def pytest_sessionstart(session) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller watches
        return
    private = Path(tempfile.mkdtemp(prefix="pytest-run-"))
    private.chmod(0o1777)  # as /tmp: the verifier's sandbox runs as another uid below it
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    _LITTER.update(private=private, home=_home_entries())


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path clean-up, which still reads its base folder
def pytest_sessionfinish(session, exitstatus) -> None:
    private = _LITTER.pop("private", None)
    if private is None:
        return
    left = sorted(p.name for p in private.iterdir() if p.name.startswith(_PROJECT_NAMES))
    cache = paths.cache_dir()
    inside = {cache, *cache.parents}  # the cache, its folder (~/.cache) and what is below it
    new = sorted(str(p) for p in _home_entries() - _LITTER["home"] if p not in inside and cache not in p.parents)
    problems = [f"left in the temporary directory {private}: {', '.join(left)}"] if left else []
    problems += [f"new in HOME outside the project's cache ({cache}): {', '.join(new)}"] if new else []
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for problem in problems:
            (reporter.write_line if reporter else print)(f"polarstack litter check: {problem}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not left:
        shutil.rmtree(private, ignore_errors=True)
