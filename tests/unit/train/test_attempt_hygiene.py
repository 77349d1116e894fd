"""What each training attempt inherits from the last one (the second fresh node-path review of issue 26's changes):

- under `nohup make train` a dropped session's SIGHUP must not stop the job: the host's handler is installed only for a
  signal that is not already ignored (it had replaced nohup's SIG_IGN and `ray job stop`ped the run);
- one port for the trainer's Ray dashboard: the RAY_DASHBOARD_PORT knob that `ray start --dashboard-port` gets is the
  one the submit, the active-job check and the stop use (they used configs/train/defaults.yaml's 8265 whatever the knob,
  while make up's port check tells the user to move the knob);
- before every job the engines get POST /continue_generation: a job stopped between slime's pause_generation and
  continue_generation around a weight reload leaves them paused, and every request then waits.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import signal
import subprocess
import sys
import threading

import pytest

from polarstack import processes
from polarstack.paths import load_defaults
from polarstack.stack import compose, profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import launch
from polarstack.train.plan import build_plan
from train_fakes import fake_node_for_train

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_signals():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_an_ignored_sighup_stays_ignored_and_sigterm_still_interrupts(restore_signals):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup hands over
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous = processes.interrupt_on(signal.SIGTERM, signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is processes.raise_interrupt
    assert set(previous) == {signal.SIGTERM}


def test_without_nohup_sighup_interrupts_like_ctrl_c(restore_signals):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    processes.interrupt_on(signal.SIGTERM, signal.SIGHUP)
    assert signal.getsignal(signal.SIGHUP) is processes.raise_interrupt
    with pytest.raises(KeyboardInterrupt):
        processes.raise_interrupt(signal.SIGHUP, None)


def test_a_nohup_process_survives_the_sighup_of_a_dropped_session():
    program = (
        "import os, signal, time\n"
        "from polarstack import processes\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "processes.interrupt_on(signal.SIGTERM, signal.SIGHUP)\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "time.sleep(0.2)\n"
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "survived", proc.stderr


def test_the_dashboard_port_follows_the_knob(monkeypatch):
    monkeypatch.setenv("RAY_DASHBOARD_PORT", "31265")
    profile = profiles.load("engine-direct")
    plan = build_plan("humaneval", profile, run_id="t", config=load_defaults(), cluster=load_cluster())
    script = plan.files["launch.sh"]
    assert "127.0.0.1:31265" in script and "127.0.0.1:8265" not in script
    assert plan.config["ray"]["dashboard_port"] == 31265
    seen = []
    monkeypatch.setattr(
        compose, "run_compose", lambda p, args, **kw: seen.append(args) or subprocess.CompletedProcess(args, 0, "[]\n")
    )
    # a config with 8265: the knob still wins
    launch.refuse_active_job(profile, load_defaults(), compose.Place(False, plan.cluster))
    assert "http://127.0.0.1:31265" in seen[-1]


def test_without_the_knob_the_configured_port_is_used():
    loaded = profiles.load("engine-direct")
    # the plan's stack settings all unset (as if neither the profile, the environment nor configs/stack.env gave them)
    unset = dict.fromkeys(("RAY_DASHBOARD_PORT", "WEIGHT_SYNC_TRANSPORT", "WEIGHT_UPDATE_DIR"), "")
    profile = dataclasses.replace(loaded, settings={**loaded.settings, **unset})
    config = load_defaults()
    config["ray"]["dashboard_port"] = 8299
    plan = build_plan("humaneval", profile, run_id="t", config=config, cluster=load_cluster())
    assert "127.0.0.1:8299" in plan.files["launch.sh"]


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
        _Recorder.seen.append((self.path, body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_every_engine_is_told_to_continue_generation_before_a_job(monkeypatch, capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with socket_closed_port() as dead:
            live = f"http://127.0.0.1:{server.server_address[1]}"
            monkeypatch.setattr(profiles, "docker_engine_urls", lambda profile: [live, f"http://127.0.0.1:{dead}"])
            _Recorder.seen.clear()
            warnings = launch.resume_engines(profiles.load("router-passthrough"), load_cluster())
    finally:
        server.shutdown()
        server.server_close()
    assert [(path, json.loads(body)) for path, body in _Recorder.seen] == [("/continue_generation", {})]
    assert len(warnings) == 1 and f":{dead}/continue_generation failed" in warnings[0]
    assert capsys.readouterr().err.strip().splitlines() == warnings


class socket_closed_port:
    """A loopback port nothing listens on (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc) -> None:
        return None


def test_each_attempt_resumes_the_engines_after_releasing_the_router(tmp_path, monkeypatch, capsys):

    from polarstack.cli.main import main

    order = []
    fake_node_for_train(monkeypatch, tmp_path)
    monkeypatch.setattr(launch, "release_router_workers", lambda profile, cluster: order.append("release") or [])
    monkeypatch.setattr(launch, "resume_engines", lambda profile, cluster: order.append("resume") or [])

    def trainer(profile, args, **kw):
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, "     Avail\n10000000000000\n", "")
        if "polarstack.train.ray_job" in args:
            return subprocess.CompletedProcess(args, 0, "[]\n", "")
        if args[-1].endswith(".sh"):
            order.append("job")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    assert main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]) == 0, (
        capsys.readouterr().err
    )
    assert order == ["release", "resume", "job"]
