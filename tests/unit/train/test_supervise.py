"""Issue 18 point 4: `make train` supervises the job, driven here with a fake job (one scripted step per attempt).

Polar's worker makes an uncategorised task failure fatal and expects an outer supervisor to restart the job from
its last checkpoint; the supervisor resumes after such failures, never after a gate stop, restarts from scratch
at most once before the first checkpoint, and stops after an attempt that wrote no new checkpoint."""

import pytest

from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_defaults
from polarstack.train import supervise
from train_fakes import fake_node_for_train

pytestmark = pytest.mark.unit


class FakeJob:
    """Each step: (exit code, checkpoint iteration after the attempt or None, gate sentence or None)."""

    def __init__(self, steps, checkpoint=None):
        self.steps, self.ckpt, self.gate, self.calls = list(steps), checkpoint, None, []

    def attempt(self, resume):
        rc, ckpt, gate = self.steps.pop(0)
        self.calls.append(resume)
        self.gate = gate
        if ckpt is not None:
            self.ckpt = ckpt
        return rc

    def run(self, resume=False, max_restarts=3):
        return supervise.supervise(
            self.attempt,
            lambda: self.ckpt,
            lambda: self.gate,
            max_restarts=max_restarts,
            resume=resume,
            describe="the fake job",
            logs="the fake logs",
            log=lambda m: None,
        )


def test_a_crash_after_a_checkpoint_resumes_from_it():
    job = FakeJob([(1, 5, None), (0, 10, None)])
    outcome = job.run()
    assert job.calls == [False, True] and [a["exit"] for a in outcome.attempts] == [1, 0]


def test_a_gate_stop_is_never_restarted():
    job = FakeJob([(11, 5, "the watchdog stopped the job: no group in 3600 s"), (0, None, None)])
    with pytest.raises(StackError) as exc:
        job.run()
    assert exc.value.code == ExitCode.GATE and "watchdog" in exc.value.message and job.calls == [False]


def test_before_the_first_checkpoint_it_restarts_from_scratch_once():
    job = FakeJob([(1, None, None), (1, None, None), (0, None, None)])
    with pytest.raises(StackError) as exc:
        job.run()
    assert job.calls == [False, False] and "before writing its first checkpoint" in exc.value.message
    assert exc.value.message.endswith("see the fake logs.")  # where the caller says the output is


def test_a_fresh_restart_that_then_checkpoints_goes_on_resuming():
    job = FakeJob([(1, None, None), (1, 5, None), (0, 10, None)])
    job.run()
    assert job.calls == [False, False, True]


def test_it_stops_after_an_attempt_that_wrote_no_new_checkpoint():
    job = FakeJob([(1, 5, None), (1, None, None), (0, None, None)])  # the resumed attempt crashed before its save
    with pytest.raises(StackError) as exc:
        job.run()
    assert job.calls == [False, True] and "without writing a checkpoint newer than iteration 5" in exc.value.message
    assert exc.value.code == ExitCode.ENVIRONMENT


def test_restarts_are_bounded_by_the_knob():
    job = FakeJob([(1, 5, None), (1, 10, None), (1, 15, None), (0, 20, None)])
    with pytest.raises(StackError) as exc:
        job.run(max_restarts=2)
    assert job.calls == [False, True, True] and "supervise.max_restarts=2" in exc.value.message
    assert "iteration 15" in exc.value.message and "RESUME=1" in exc.value.message


def test_a_resumed_run_that_crashes_without_a_new_save_stops_at_once():
    job = FakeJob([(1, None, None)], checkpoint=7)
    with pytest.raises(StackError) as exc:
        job.run(resume=True)
    assert job.calls == [True] and "newer than iteration 7" in exc.value.message


def test_the_knob_and_the_save_interval_are_in_the_defaults():
    config = load_defaults()
    assert config["supervise"]["max_restarts"] == 3 and config["checkpoint"]["save_interval"] == 5
    assert supervise.parse_iteration("12\n") == 12 and supervise.parse_iteration("") is None


def test_make_train_resumes_with_the_resume_script_after_a_crash(tmp_path, monkeypatch, capsys):
    """Through `polarstack train` on the docker runtime with a fake trainer: launch.sh crashes after a checkpoint,
    the supervisor reads the iteration inside the trainer and runs launch-resume.sh (--load), which succeeds."""
    import subprocess

    from polarstack.cli.main import main
    from polarstack.stack import compose

    fake_node_for_train(monkeypatch, tmp_path)
    ran = []

    def trainer(profile, args, **kw):
        if args[-1].endswith(".sh"):
            ran.append(args[-1].rsplit("/", 1)[-1])
            return subprocess.CompletedProcess(args, 0 if args[-1].endswith("launch-resume.sh") else 1, "", "")
        if "cat" in args:  # latest_checkpointed_iteration.txt inside the trainer
            return subprocess.CompletedProcess(args, 0, "5\n" if ran else "", "")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    assert main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"]) == 0, (
        capsys.readouterr().err
    )
    assert ran == ["launch.sh", "launch-resume.sh"]
    (run_dir,) = (tmp_path / "run" / "train").iterdir()
    assert "--load /checkpoints/polarstack/humaneval-engine-direct" in (run_dir / "launch-resume.sh").read_text()
    assert "--load" not in (run_dir / "launch.sh").read_text()
    assert "resuming from its checkpoint at iteration 5" in capsys.readouterr().err


def _docker_train_with_launch_exit(tmp_path, monkeypatch, launch_exit: int):
    """`polarstack train` on the docker runtime whose launch.sh exits `launch_exit` at every attempt."""
    import subprocess

    from polarstack.cli.main import main
    from polarstack.stack import compose

    fake_node_for_train(monkeypatch, tmp_path)
    ran = []

    def trainer(profile, args, **kw):
        if args[-1].endswith(".sh"):
            ran.append(args[-1].rsplit("/", 1)[-1])
            return subprocess.CompletedProcess(args, launch_exit, "", "")
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, "     Avail\n10000000000000\n", "")
        if "polarstack.train.ray_job" in args:
            return subprocess.CompletedProcess(args, 0, "[]\n", "")
        return subprocess.CompletedProcess(args, 1, "", "")  # no checkpoint

    monkeypatch.setattr(compose, "run_compose", trainer)
    code = main(["train", "--task", "humaneval", "--runtime", "docker", "--without-rehearsal"])
    return code, ran


def test_a_crash_names_the_run_directorys_logs_not_the_ray_heads(tmp_path, monkeypatch, capsys):
    """launch.sh runs through `docker compose exec`: `make logs SERVICE=trainer` shows only the Ray head. The refusal
    names launch.log (launch.sh tees its and the job's output there) and the Polar logs beside it."""
    code, ran = _docker_train_with_launch_exit(tmp_path, monkeypatch, 1)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    (run_dir,) = (tmp_path / "run" / "train").iterdir()
    assert code == ExitCode.ENVIRONMENT and ran == ["launch.sh", "launch.sh"]
    assert f"see {run_dir}/launch.log" in err and "polar-rollout.log, polar-gateway.log and retention.log" in err
    assert "job-id.txt" in err and "SERVICE=trainer" not in err


def test_a_polar_server_of_another_launch_is_state_and_never_restarted(tmp_path, monkeypatch, capsys):
    """launch.sh's POLAR_PORT_HELD: every attempt would find the same server on Polar's ports, so `make train` stops at
    once with STATE and the way out, instead of taking it for a crash and restarting from scratch."""
    from polarstack.train.plan import POLAR_PORT_HELD

    code, ran = _docker_train_with_launch_exit(tmp_path, monkeypatch, POLAR_PORT_HELD)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == ExitCode.STATE and ran == ["launch.sh"], err
    ports = load_defaults()["polar"]
    assert f"port {ports['rollout_port']} (rollout) or {ports['gateway_port']} (gateway)" in err
    assert "`make down` and `make up`" in err and "restarting" not in err


def test_a_polar_server_that_did_not_start_names_its_logs_and_is_not_restarted(tmp_path, monkeypatch, capsys):
    from polarstack.train.plan import POLAR_START_FAILED

    code, ran = _docker_train_with_launch_exit(tmp_path, monkeypatch, POLAR_START_FAILED)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    (run_dir,) = (tmp_path / "run" / "train").iterdir()
    assert code == ExitCode.POLAR_START and ran == ["launch.sh"], err
    assert f"{run_dir}/polar-rollout.log and polar-gateway.log say why" in err
