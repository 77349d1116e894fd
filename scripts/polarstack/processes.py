"""Processes the stack starts on loopback: free ports, readiness polling, start of an emulator, stop by pid."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from polarstack import http as stack_http
from polarstack.errors import ExitCode, StackError
from polarstack.paths import tool_homes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not listen on `host`:`port` now: the one probe of both runtimes (`make up`'s check of
    the profile's ports, the local runtime's at NODES>1, the search for a real engine's port). It binds as the servers
    do, with SO_REUSEADDR (uvicorn, sglang's server, the routers and Ray's GCS all set it): a port whose last
    connections are only in TIME_WAIT (a stack stopped a moment ago) is free, a port with a listener is taken.
    Another failure than EADDRINUSE (an address this host does not hold, a privileged port) is raised as OSError for
    the caller to name."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: every socket is held until all are chosen (free_port twice may answer one port)."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


# How long a process the stack or a test starts may take to answer, on this machine now (issue 34 point 2): the base
# (what a quiet machine needs, with a margin) times how overloaded the CPUs are, max(1, load / cores), with the load
# the largest of the 1- and 5-minute averages and the tasks runnable now besides the reader (/proc/loadavg's fourth
# field: the averages lag a load that began less than a minute ago), and cores the CPUs this process may run on; at
# least the base, at most
# STARTUP_CEILING_FACTOR times it (and at most `ceiling` when the caller's own deadline is shorter). A stand-in engine
# that answers in about a second when quiet got 30 s and missed them at load 10 on 2 cores: it now gets 120 s there.
STARTUP_CEILING_FACTOR = 4.0


def startup_seconds(
    base: float, *, ceiling: float | None = None, load: float | None = None, cores: int | None = None
) -> float:
    """The start-up deadline for `base` seconds on this machine now (the rule above); `load` and `cores` default to
    the machine's (os.getloadavg, os.sched_getaffinity)."""
    if load is None:
        one, five, _fifteen = os.getloadavg()
        load = max(one, five, runnable_now())
    if cores is None:
        cores = len(os.sched_getaffinity(0)) or 1
    top = base * STARTUP_CEILING_FACTOR
    if ceiling is not None:
        top = min(top, ceiling)
    return max(base, min(base * max(1.0, load / cores), top))


def runnable_now() -> float:
    """Tasks runnable on this machine now, the reader excluded (the numerator of /proc/loadavg's fourth field); 0
    where the file is missing or unreadable."""
    try:
        with open("/proc/loadavg") as file:
            running = file.read().split()[3].split("/")[0]
        return max(0.0, float(running) - 1)
    except (OSError, IndexError, ValueError):
        return 0.0


def favour_session(pid: int, nice: int) -> bool:
    """Give the session of `pid` the CPU share of `nice` where the kernel's autogroup applies (a session is then one
    scheduling group: /proc/<pid>/autogroup; sched(7)), so work started in a session of its own is not held to one
    share among many busy sessions. True when set; False where there is no autogroup or raising a priority is not
    allowed here (CAP_SYS_NICE), which leaves the share as it was."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def announced_install(what: str, where: Path, why: str = ""):
    """A pip install a person would otherwise wait on in silence (a cold one takes seconds to minutes): one line on
    stderr before it, naming what goes where (and why, when the command did not ask for it), and one after with its
    time. Nothing after a failure: the caller's one sentence says what went wrong."""
    print(f"polarstack: installing {what} into {where}{f' ({why})' if why else ''} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    yield
    print(f"polarstack: {what} installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def stop_pid(pid: int, process: subprocess.Popen | None = None, timeout: float = 10.0) -> None:
    """Stop the process we started, by its pid: SIGTERM, then SIGKILL after `timeout`."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                return
        else:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    return
            except ChildProcessError:
                if not _alive(pid):
                    return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        process.wait(timeout=5)


@contextlib.contextmanager
def shielded():
    """Defer SIGINT and SIGTERM while the body runs (teardown that must finish), then deliver the first one.

    A second Ctrl-C during teardown used to interrupt the stopping itself and orphan processes. Outside the main
    thread signal handlers cannot be set, and the body simply runs.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received and not sys.exc_info()[0]:
            if received[0] == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), received[0])  # SIGTERM: what the previous handler (default: exit) does


def raise_interrupt(signum, _frame) -> None:
    """A signal handler: the signal ends the command like Ctrl-C (KeyboardInterrupt), so its `finally` blocks run."""
    raise KeyboardInterrupt


def interrupt_on(*signals: signal.Signals) -> dict[signal.Signals, Any]:
    """From now on each of `signals` raises KeyboardInterrupt, except one this process inherited as ignored: under
    `nohup make train` a dropped session's SIGHUP must not stop the job (docs/gpu-node.md). Returns the handlers
    replaced, to restore."""
    previous = {}
    for sig in signals:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, raise_interrupt)
    return previous


def sigterm_as_interrupt() -> None:
    """From now on SIGTERM (`kill`, `timeout`, a cancelled CI job) raises KeyboardInterrupt, so a command that
    started processes stops them in its `finally` as on Ctrl-C instead of dying and orphaning them."""
    interrupt_on(signal.SIGTERM)


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if there is no such process.

    Routers retitle themselves (smg shows as `smg::router`, sglang-router 0.3.2 as `sglang::router`), so
    command lines cannot identify them; (pid, start time) does, and a recycled pid has another start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished
        return None
    return int(fields[19])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_http(url: str, timeout: float, process: subprocess.Popen | None = None, path: str = "/health") -> float:
    """Poll GET url+path until it answers 2xx; returns the seconds waited. Raises StackError on timeout/exit."""

    started = time.monotonic()
    deadline = started + timeout
    with stack_http.client(1.0) as http:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise StackError(
                    f"process {process.pid} serving {url} exited with code {process.returncode} "
                    "before it became healthy.",
                    ExitCode.ENVIRONMENT,
                )
            try:
                if 200 <= stack_http.request(http, "GET", url + path).status < 300:
                    return time.monotonic() - started
            except StackError:
                pass
            time.sleep(0.05)
    raise StackError(f"{url}{path} did not answer 2xx within {timeout:g} s.", ExitCode.UNREACHABLE)


SECRET_PREFIXES = ("HF_", "HUGGING", "AWS_", "OPENAI_")


def child_env() -> dict[str, str]:
    """This process's environment without credentials: what every process the stack starts inherits; pip, npm and
    rustup's proxies keep their caches under the project's cache, not in HOME (paths.tool_homes)."""
    return {**tool_homes(), **{k: v for k, v in os.environ.items() if not k.startswith(SECRET_PREFIXES)}}


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive lock on `path` (created with its folder): one install of a cached venv, wheel or model at a
    time, whether two CLIs or two parallel test workers ask for it; the second waits and then finds it done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Served:
    """What a server the stack started on 127.0.0.1 offers (a router release, a real engine): its URL, pid and the
    last lines of its log. The class using it has `process`, `port` and `log_path`."""

    process: subprocess.Popen
    port: int
    log_path: Path

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
