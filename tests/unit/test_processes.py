"""Pins polarstack.processes.sigterm_as_interrupt, which `up` and `routers matrix` use so that `kill`, `timeout` or a
cancelled CI job stops what they started (their `finally`) instead of killing them with it running; free ports; and
port_taken, the one port probe of both runtimes, which answers as the servers bind (issue 34)."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from default_signals import default_signals

pytestmark = pytest.mark.unit

SCRIPT = """
import os, signal, sys, time
from polarstack.processes import sigterm_as_interrupt
if sys.argv[1] == "on":
    sigterm_as_interrupt()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except KeyboardInterrupt:
    print("cleaned up")
    sys.exit(0)
"""


@pytest.mark.parametrize("mode", ["on", "off"])
def test_sigterm_runs_the_cleanup_only_when_turned_into_an_interrupt(mode):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "scripts")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        preexec_fn=default_signals,  # SIGTERM at its default, not inherited as ignored (issue 34 point 4)
    )
    if mode == "on":
        assert proc.returncode == 0 and proc.stdout == "cleaned up\n", proc.stderr
    else:  # the default: the process dies at once, its cleanup never runs
        assert proc.returncode == -15 and proc.stdout == ""


def test_free_ports_are_distinct_and_free():
    import socket

    from polarstack.processes import free_ports

    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # free again once returned


# --- the one port probe (issue 34): as the servers bind, with SO_REUSEADDR --------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import time_wait  # noqa: E402


def test_a_port_left_in_time_wait_is_free_and_a_listener_is_taken():
    import socket

    from polarstack.processes import port_taken

    port = time_wait.leave_time_wait()  # the bind `make up` used to probe with is refused here ...
    assert not port_taken(port)  # ... but a server (SO_REUSEADDR) can listen: free
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))  # what the probe promised
        server.listen()
        assert port_taken(port)  # a real listener, even one that set SO_REUSEADDR itself, stays taken
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bound:
        bound.bind(("127.0.0.1", 0))  # bound without SO_REUSEADDR and not listening: no server could take it
        assert port_taken(bound.getsockname()[1])


def test_another_bind_failure_is_raised_for_the_caller_to_name():
    from polarstack.processes import port_taken

    with pytest.raises(OSError) as raised:
        port_taken(0, "192.0.2.1")  # TEST-NET-1: an address this host does not hold
    assert raised.value.errno == errno.EADDRNOTAVAIL


def test_no_other_module_probes_a_port_by_binding_it():
    """Every probe of a given port goes through port_taken: a bind of a fixed port elsewhere in the package (a bind of
    port 0 asks the kernel for a free one and is no probe) would answer differently from the servers again."""
    root = Path(__file__).resolve().parents[2] / "scripts" / "polarstack"
    offenders = []
    for path in root.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ".bind((" in line and ", 0))" not in line and path.name != "processes.py":
                offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert offenders == []
