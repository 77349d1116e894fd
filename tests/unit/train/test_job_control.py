"""Pins one Ray job at a time (the third review's finding A): make train refuses while the trainer's Ray cluster has a
PENDING or RUNNING job, before it releases the router's workers; launch.sh submits with --submission-id
<run>-<attempt> and its EXIT trap (reached on INT, TERM, HUP too) runs `ray job stop` of that id; Polar servers an
earlier attempt left are stopped by pid and the health loop passes only while this attempt's servers live; its two Polar
failures exit with codes of their own (never 1, which the supervisor takes for a crash and restarts); and the script
tees its own and the job's output to launch.log in the run's directory, which survives `make down`."""

import copy
import json
import os
import signal
import subprocess
import time

import pytest

from default_signals import default_signals, defaults_here
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.paths import load_defaults
from polarstack.processes import startup_seconds
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import ray_job
from polarstack.train.plan import POLAR_PORT_HELD, POLAR_START_FAILED, build_plan, job_control_lines
from train_fakes import fake_node_for_train, rendered_launch_sh

pytestmark = pytest.mark.unit


def _docker_train(tmp_path, monkeypatch, jobs: str):
    from polarstack.stack import compose
    from polarstack.train import launch

    fake_node_for_train(monkeypatch, tmp_path)
    released, ran = [], []
    monkeypatch.setattr(launch, "release_router_workers", lambda profile, cluster: released.append(profile.name) or [])

    def trainer(profile, args, **kw):
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, "     Avail\n10000000000000\n", "")
        if "polarstack.train.ray_job" in args:
            return subprocess.CompletedProcess(args, 0, jobs + "\n", "")
        ran.append(args[-1])
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    code = main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"])
    return code, ran, released


def test_make_train_refuses_while_a_ray_job_runs(tmp_path, monkeypatch, capsys):
    running = json.dumps([{"submission_id": "humaneval-engine-direct-1", "status": "RUNNING"}])
    code, ran, released = _docker_train(tmp_path, monkeypatch, running)
    err = capsys.readouterr().err
    assert code == ExitCode.STATE, err
    assert "humaneval-engine-direct-1 (RUNNING)" in err and "ray job stop" in err and "Traceback" not in err
    assert not [a for a in ran if a.endswith(".sh")] and released == []  # nothing submitted, no engine released


def test_make_train_launches_when_no_job_is_active(tmp_path, monkeypatch, capsys):
    code, ran, released = _docker_train(tmp_path, monkeypatch, "[]")
    assert code == 0, capsys.readouterr().err
    assert any(a.endswith("launch.sh") for a in ran) and released == ["engine-direct"]


def test_launch_sh_submits_with_an_attempt_id_and_passes_the_offline_check():
    plan = build_plan(
        "humaneval", profiles.load("engine-direct"), run_id="r", config=load_defaults(), cluster=load_cluster()
    )
    script = plan.files["launch.sh"]
    assert '--submission-id="$submission_id"' in script and "attempt_id=r-$((" in script
    assert ray_job.job_control_problems(plan.commands[3], script) == []
    assert ray_job.job_control_problems(plan.commands[3], script.replace("trap 'exit 129' HUP\n", ""))
    facts = copy.deepcopy(ray_job.record())
    facts["job_status"]["active"] = ["PENDING", "RUNNING", "QUEUED"]
    assert any("non-terminal" in p for p in ray_job.job_control_problems(plan.commands[3], script, facts))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_trap_stops_this_attempts_job_on_a_signal(tmp_path, sig):
    """The rendered job-control lines run by bash with a fake `ray`: a signal during the (background) submit makes the
    EXIT trap `ray job stop` <run>-<attempt> and stop the submit client; the next attempt gets id <run>-2."""
    config = load_defaults()
    plan = build_plan("humaneval", profiles.load("engine-direct"), run_id="r", config=config, cluster=load_cluster())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text('#!/usr/bin/env bash\necho "ray $*" >> "$RAY_LOG"\n')
    (bin_dir / "ray").chmod(0o755)
    script = tmp_path / "launch.sh"
    lines = [
        "set -euo pipefail",
        f"cd {tmp_path}",
        *job_control_lines(plan, config),
        'submission_id="$attempt_id"',
        "sleep 60 & submit_pid=$! pids+=($!)",
        "echo $submit_pid > submit.pid",
        'wait "$submit_pid"',
    ]
    script.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_LOG": str(tmp_path / "ray.log")}
    for attempt in (1, 2):
        (tmp_path / "submit.pid").unlink(missing_ok=True)
        # the signals at their defaults: a shell started in the background of a non-interactive one (a CI runner)
        # inherits SIGINT ignored, `nohup` SIGHUP, and bash can neither trap nor reset a signal ignored on entry
        # (bash(1), SIGNALS); the sleeper, bash's child, then gets the default SIGTERM of its cleanup's `kill` too
        proc = subprocess.Popen(["bash", str(script)], env=env, preexec_fn=default_signals)
        deadline = time.monotonic() + 10
        # the file exists before `echo` wrote it: wait for its digits
        while time.monotonic() < deadline and not _read(tmp_path / "submit.pid").strip().isdigit():
            time.sleep(0.05)
        sleeper = int((tmp_path / "submit.pid").read_text())
        proc.send_signal(sig)
        assert proc.wait(timeout=startup_seconds(10)) == 128 + sig
        port = config["ray"]["dashboard_port"]
        assert (tmp_path / "ray.log").read_text().splitlines()[-1] == (
            f"ray job stop --address=http://127.0.0.1:{port} r-{attempt}"
        )
        deadline = time.monotonic() + 10  # the killed client is gone (or a zombie) soon, later on a loaded machine
        while _alive(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(sleeper)


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _alive(pid: int) -> bool:
    """pid exists and is not a zombie."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _polar_script(tmp_path, serve: str) -> "os.PathLike":
    """polar_lines rendered with fake servers (`serve`) and a fake health check: healthy while tmp/healthy exists."""
    from polarstack.train.plan import polar_lines

    check = tmp_path / "healthcheck"
    check.write_text(f'import os, sys\nsys.exit(0 if os.path.exists("{tmp_path}/healthy") else 1)\n')
    body = "\n".join(polar_lines(["bash", "-c", serve], ["bash", "-c", serve], ["http://a", "http://b"]))
    script = tmp_path / "polar.sh"
    script.write_text(
        "\n".join(["set -euo pipefail", f"cd {tmp_path}", "pids=()", body, 'kill "${pids[@]}"', "echo started"])
        .replace("/usr/local/bin/polarstack-healthcheck", str(check))
        .replace("seq 1 60", "seq 1 3")
        .replace("seq 1 10", "seq 1 2")
        + "\n"
    )
    return script


def test_a_polar_server_of_another_launch_refuses_the_attempt(tmp_path):
    script = _polar_script(tmp_path, "sleep 30")
    (tmp_path / "healthy").touch()  # something already answers on Polar's ports before this attempt starts any
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=startup_seconds(30))
    assert proc.returncode == POLAR_PORT_HELD and "of another launch still answers at http://a" in proc.stderr
    assert not (tmp_path / "polar-rollout.pid").exists()  # it started nothing


def test_the_health_loop_fails_when_this_attempts_server_exited(tmp_path):
    script = _polar_script(tmp_path, "touch healthy; exit 3")  # it "answers" once, then is gone
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=startup_seconds(30))
    assert proc.returncode == POLAR_START_FAILED and "a Polar server exited" in proc.stderr


def test_the_health_loop_fails_when_this_attempts_server_never_answers(tmp_path):
    # Alive, never healthy, for longer than the loop can take on this machine now: a fixed 30 s ended the fake server
    # before the loop's last check at load 16-23 ("a Polar server exited" instead of "no answer").
    life = int(startup_seconds(60))
    script = _polar_script(tmp_path, f"exec sleep {life}")
    try:
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=startup_seconds(60))
    finally:
        for name in ("polar-rollout.pid", "polar-gateway.pid"):  # the script exits without stopping them
            pid = int(_read(tmp_path / name) or 0)
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == POLAR_START_FAILED and "no answer from http://a" in proc.stderr
    assert "polar-rollout.log, polar-gateway.log" in proc.stderr.splitlines()[-1]


def test_servers_left_by_an_earlier_attempt_are_stopped_by_their_pids(tmp_path):
    old = subprocess.Popen(["bash", "-c", "exec -a polar-serve-old sleep 60"], preexec_fn=default_signals)
    try:
        (tmp_path / "polar-rollout.pid").write_text(f"{old.pid}\n")
        script = _polar_script(tmp_path, "touch healthy; sleep 30")
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=startup_seconds(30))
        assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr
        assert old.wait(timeout=startup_seconds(5)) == -signal.SIGTERM
        assert int((tmp_path / "polar-rollout.pid").read_text()) != old.pid
    finally:
        if old.poll() is None:
            old.kill()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_make_train_stops_the_attempts_job(tmp_path, monkeypatch, capsys, how):
    """docker exec passes no signal into the trainer: the host stops the job launch.sh recorded in job-id.txt."""
    from polarstack.stack import compose

    fake_node_for_train(monkeypatch, tmp_path)
    calls = []

    def trainer(profile, args, **kw):
        calls.append(args)
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, "     Avail\n10000000000000\n", "")
        if "polarstack.train.ray_job" in args:
            return subprocess.CompletedProcess(args, 0, "[]\n", "")
        if args[-1].endswith("launch.sh"):  # the job is running when make is interrupted
            run = tmp_path / "run" / "train" / args[-1].split("/")[-2]
            (run / "job-id.txt").write_text(f"{run.name}-1\n")
            if how == "SIGINT":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    with defaults_here(signal.SIGTERM):  # this test sends SIGTERM to pytest itself: not the one pytest inherited
        before, before_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
        code = main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"])
        after, after_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    assert code == 130, capsys.readouterr().err
    stop = [a for a in calls if "stop" in a]
    port = load_defaults()["ray"]["dashboard_port"]
    assert stop and stop[-1][-5:] == ["ray", "job", "stop", f"--address=http://127.0.0.1:{port}", stop[-1][-1]]
    assert stop[-1][-1].endswith("-1")
    assert after is before and after_hup is before_hup  # restored


def test_launch_sh_tees_its_and_the_jobs_output_to_launch_log(tmp_path):
    """`make logs SERVICE=trainer` shows the Ray head only, and the driver's log is in the container's /tmp/ray: the
    job's output (which `ray job submit` streams) and launch.sh's own lines are kept in launch.log, every attempt's
    appended, and the script's exit is still the job's."""
    script = rendered_launch_sh(tmp_path, 'echo "driver: step 1"; echo "driver: crashed" >&2; exit 3')
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    runs = []
    for _ in (1, 2):
        (tmp_path / "healthy").unlink(missing_ok=True)  # the last attempt's fake servers are stopped by its cleanup
        runs.append(
            subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=startup_seconds(60), env=env)
        )
    assert [proc.returncode for proc in runs] == [3, 3], runs[0].stderr
    assert "driver: step 1" in runs[0].stdout and "driver: crashed" in runs[0].stdout  # the terminal still sees it
    log = (tmp_path / "launch.log").read_text()
    assert log.count("driver: step 1") == 2 and log.count("driver: crashed") == 2
    assert (tmp_path / "job-id.txt").read_text().strip() == "r-2"
