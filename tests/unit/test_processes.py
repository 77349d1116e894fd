"""Pins polarstack.processes.sigterm_as_interrupt, which `up` and `routers matrix` use so that `kill`, `timeout` or a
cancelled CI job stops what they started (their `finally`) instead of killing them with it running."""

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
