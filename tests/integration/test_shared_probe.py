"""Pins make preflight's SHARED_DIR proof (issue 28 point 5, polarstack.checks.shared_probe) with the pinned Ray: the
probe, run as a script by Ray's own python against a real head (one node here: the netns tier has two), writes a nonce,
runs a task pinned to every alive node by NodeAffinitySchedulingStrategy, and reads each node's file back; the result
names the node by its Ray address and holds only the nonce's hash. The verdict (`problems`) names each node of
NODE_ADDRS that did not read the head's file, whose file did not come back, or that ran no task."""

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import RAY_SESSION_NICE, RAY_START_CEILING, RAY_START_SECONDS
from polarstack.checks import shared_probe
from polarstack.errors import ExitCode, StackError
from polarstack.processes import free_port, startup_seconds
from polarstack.stack import ray_head

pytestmark = pytest.mark.ray
SCRIPT = Path(shared_probe.__file__)


@pytest.fixture
def head(ray_bin):
    base = Path(tempfile.mkdtemp(prefix="ps-sp-", dir="/tmp"))
    for attempt in (1, 2, 3):  # ray's own hard-coded 30 s start-up timeouts (its client server's wait for the node's
        # registration, ray/_private/services.py get_node_with_retry) expired at load 11 on 2 cores: `ray start` exits
        gcs, dashboard = free_port(), free_port()
        command = ray_head.head_command(gcs_port=gcs, dashboard_port=dashboard, num_gpus=0, block=True)
        temp = base / str(attempt)
        try:
            running = ray_head.start(
                command,
                dict(ray_head.LOOPBACK_ENV),
                bin_dir=ray_bin,
                temp_dir=temp,
                dashboard_port=dashboard,
                timeout=startup_seconds(RAY_START_SECONDS, ceiling=RAY_START_CEILING),
                session_nice=RAY_SESSION_NICE,
            )
            break
        except StackError as exc:
            if exc.code != ExitCode.ENVIRONMENT or attempt == 3:  # only "ray start exited" is retried
                raise
    try:
        yield gcs, ray_bin, temp
    finally:
        running.stop()
        # Ray's sockets need a short path, hence /tmp itself (outside the run's own TMPDIR, which the end-of-run
        # check watches): removed here, as the cold CI run of 2026-12-03 found it left behind.
        shutil.rmtree(base, ignore_errors=True)
        assert not running.pids


def run_probe(ray_bin, gcs, temp, directory):
    env = {"PATH": f"{ray_bin}:/usr/bin:/bin", "RAY_TMPDIR": str(temp), **ray_head.LOOPBACK_ENV}
    proc = subprocess.run(
        [str(ray_bin / "python"), str(SCRIPT), "--dir", str(directory), "--address", f"127.0.0.1:{gcs}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_node_reads_and_writes_the_shared_directory(head, tmp_path):
    gcs, ray_bin, temp = head
    result = run_probe(ray_bin, gcs, temp, tmp_path / "probe")
    assert result["nodes"] == {"127.0.0.1": {"read": True, "wrote": True}}
    nonce = (tmp_path / "probe" / "head.txt").read_text().strip()
    assert nonce not in json.dumps(result) and len(result["nonce_sha256"]) == 64
    assert shared_probe.problems(result, ["127.0.0.1"]) == []


def test_problems_name_each_node_that_does_not_share_it():
    result = {
        "nodes": {
            "10.0.0.1": {"read": True, "wrote": True},
            "10.0.0.2": {"read": False, "wrote": True},
            "10.0.0.3": {"read": True, "wrote": False, "error": "PermissionError: Permission denied"},
        }
    }
    problems = shared_probe.problems(result, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"])
    assert problems == [
        "node 1 (10.0.0.2) does not see the head's file in SHARED_DIR: it is not the same directory",
        "node 2 (10.0.0.3)'s file in SHARED_DIR did not reach the head (PermissionError: Permission denied)",
        "node 3 (10.0.0.4) ran no probe task: it is not an alive node of the Ray cluster",
    ]
    assert shared_probe.problems(None, ["10.0.0.1"])[0].startswith("the shared-directory probe gave no result")


def test_node_side_reports_what_it_read(tmp_path):
    (tmp_path / "head.txt").write_text("n1\n")
    row = shared_probe.node_side(str(tmp_path), "head.txt", "10.0.0.2")
    assert row["wrote"] and (tmp_path / "10.0.0.2.txt").read_text().strip() == "n1"
    assert row["read_sha256"] == hashlib.sha256(b"n1").hexdigest()
