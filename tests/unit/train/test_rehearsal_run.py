"""Pins `make preflight`'s sequence on the node with a fake node (issue 19): it refuses while a profile is up (the
engines load the model when they start); otherwise it brings the profile up with the small model's MODEL_PATH,
runs the job, then the resumed job, reads weight_version and the checkpoint tracker between them, writes the report
and the pass record, and takes the stack down, also when a job fails (then the report fails and names why)."""

import json
import os

import pytest

from polarstack.checks import rehearsal_report, sandbox_probe
from polarstack.errors import ExitCode, StackError
from polarstack.stack import assets, docker_state, profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.resolved import read_now
from polarstack.train import preflight, rehearsal_record, rehearsal_run
from rehearsal_fakes import FakeNode

pytestmark = pytest.mark.unit


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(assets, "check_before_up", lambda profile, *, cpu: None)
    monkeypatch.setattr(sandbox_probe, "check_in_trainer", lambda profile, where: None)
    for key in ("MODEL_PATH", "MODEL_NAME", "SERVED_MODEL_NAME"):
        monkeypatch.setenv(key, "")  # recorded as absent, so the values run() exports are undone after the test
        monkeypatch.delenv(key)
    profile = profiles.load("engine-direct")
    plan = preflight.build(profile, run_id="preflight-test", cluster=load_cluster())
    return profile, plan, tmp_path / "run" / "train" / "preflight-test"


def test_a_full_rehearsal_passes_records_and_takes_the_stack_down(setup):
    profile, plan, host = setup
    node = FakeNode(host)
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert result["passed"], result
    # the small model's stack, then the real run's (the 7B's train-only step and reload), each taken down
    assert node.compose_calls == ["up", "down", "up", "down"]
    assert node.envs_at_up == ["/models/Qwen2.5-3B-Instruct", "/models/Qwen2.5-7B-Instruct"]
    step, reload = node.seven_b_commands
    assert "launch-7b-step.sh" in step and "/models/Qwen2.5-7B-Instruct" in reload and "rehearsal-7b-reload" in reload
    assert node.releases == 3  # the router lists no engine when each job (and the restart) starts
    saved = json.loads((host / "rehearsal-report.json").read_text())
    assert saved["evidence"]["checkpoint"] == {"after_train": "1", "after_resume": "2"}
    # the restart of job 2 generates one more rollout (3) and trains none
    assert [(r["phase"], r["rollout_id"]) for r in saved["evidence"]["rollouts"]] == [
        ("train", 0),
        ("train", 1),
        ("resume", 2),
        ("resume", 3),
    ]
    assert (host / "tasks" / "train.jsonl").read_text().count("\n") == 9
    assert "passed" in rehearsal_record.require(profile, override=False, cluster=load_cluster())
    assert docker_state.read(cpu=False) is None


def test_the_rehearsal_removes_its_checkpoints_once_the_report_is_written(setup):
    """Finding B: each rehearsal saves into a checkpoint run of its own (keep_last saves of 14 B x parameters) that
    nothing resumes; it used to stay on the checkpoints volume after every rehearsal."""
    profile, plan, host = setup
    node = FakeNode(host)
    assert rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)["passed"]
    assert node.removed == [
        (f"/checkpoints/polarstack/{plan.run_id}", True)
    ]  # after the report was written, before down
    assert (host / "rehearsal-report.json").is_file()
    failed = FakeNode(host, fail_job="resume")
    rehearsal_run.run(profile, plan, read_now(), node=failed, progress=lambda m: None)
    assert [d for d, _ in failed.removed] == [f"/checkpoints/polarstack/{plan.run_id}"] and failed.compose_calls[
        -1
    ] == "down"


def test_the_rehearsal_refuses_when_its_saves_cannot_fit_the_volume(setup):
    """Finding B: make preflight ran no disk check (only make train did). The 3B rehearsal's saves (14 B x
    3,085,938,688 parameters = 43.2 GB each) and its weight-sync copy (6.2 GB) are checked once the trainer is up."""
    profile, plan, host = setup
    node = FakeNode(host, free=int(50e9))
    with pytest.raises(StackError) as info:
        rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert info.value.code == ExitCode.ENVIRONMENT and "50.0 GB free" in info.value.message
    assert "weight-sync copy of 6.2 GB" in info.value.message
    assert node.jobs == 0 and node.compose_calls[-1] == "down"


def test_a_failing_job_still_takes_the_stack_down_and_fails_the_report(setup):
    profile, plan, host = setup
    node = FakeNode(host, fail_job="resume")
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert not result["passed"] and result["first_failure"] == "weight_sync"
    assert node.compose_calls[-1] == "down"
    with pytest.raises(StackError) as info:
        rehearsal_record.require(profile, override=False, cluster=load_cluster())
    assert info.value.code == ExitCode.NO_REHEARSAL


def test_refused_while_a_profile_is_up(setup):
    profile, plan, host = setup
    docker_state.write(profiles.load("patched-router"), cpu=False)
    with pytest.raises(StackError) as info:
        rehearsal_run.run(profile, plan, read_now(), node=FakeNode(host), progress=lambda m: None)
    assert info.value.code == ExitCode.STATE and "make down" in info.value.message


def test_a_rehearsal_stopped_half_way_voids_an_earlier_pass(setup):
    profile, plan, host = setup
    rehearsal_record.write(profile, {"passed": True}, "earlier", cluster=load_cluster())
    node = FakeNode(host)

    def gate_refuses(plan):
        raise StackError("the smoke failed", ExitCode.GATE)

    node.gate = gate_refuses
    with pytest.raises(StackError) as info:
        rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert info.value.code == ExitCode.GATE and node.compose_calls == ["up", "down"]
    with pytest.raises(StackError) as refused:
        rehearsal_record.require(profile, override=False, cluster=load_cluster())
    assert refused.value.code == ExitCode.NO_REHEARSAL and "failed" in refused.value.message


def test_missing_small_model_names_the_rehearsals_make_model(setup, monkeypatch):
    profile, plan, host = setup

    def missing(profile, *, cpu):
        raise StackError(
            f"make up needs the weights of {os.environ['MODEL_NAME']} (no {assets.MODEL_MARKER} in the models "
            "volume), which are missing: run `make model`.",
            ExitCode.ASSETS_MISSING,
        )

    monkeypatch.setattr(assets, "check_before_up", missing)
    node = FakeNode(host)
    with pytest.raises(StackError) as info:
        rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert info.value.code == ExitCode.ASSETS_MISSING and node.compose_calls == []
    assert "make model MODEL_NAME=Qwen/Qwen2.5-3B-Instruct MODEL_PATH=/models/Qwen2.5-3B-Instruct" in info.value.message


def test_weights_that_slimes_script_does_not_describe_stop_before_any_job(setup):
    profile, plan, host = setup
    node = FakeNode(host, config={**FakeNode.CONFIG, "rope_theta": 10000.0})
    with pytest.raises(StackError) as info:
        rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert info.value.code == ExitCode.REHEARSAL_FAILED and "rope_theta=10000.0" in info.value.message
    assert node.jobs == 0 and node.compose_calls == ["up", "down"]


def test_job_two_runs_through_the_supervisor_which_restarts_it_once(setup):
    """Issue 26 point 2: the rehearsal's second job runs as `make train` runs its job, under
    polarstack.train.supervise, and is made to crash once; the supervisor resumes it from its checkpoint."""
    profile, plan, host = setup
    node = FakeNode(host)
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert result["passed"], result
    resume_jobs = [c for c in node.commands if "launch-resume.sh" in c]
    assert len(resume_jobs) == 2 and f"exit {rehearsal_run.INJECTED_EXIT}" in resume_jobs[0]
    assert f"exit {rehearsal_run.INJECTED_EXIT}" not in resume_jobs[1] and ">>" in resume_jobs[1]
    saved = json.loads((host / "rehearsal-report.json").read_text())
    attempts = saved["evidence"]["supervisor"]["attempts"]
    assert [(a["exit"], a["checkpoint"]) for a in attempts] == [(rehearsal_run.INJECTED_EXIT, 2), (0, None)]
    assert next(v for v in result["verdicts"] if v["class"] == "supervisor")["verdict"] == "pass"
    assert saved["evidence"]["reward_path"]["canonical_reward"] == 1.0


def test_a_resumed_job_that_crashes_before_its_checkpoint_fails_the_supervisor_class(setup):
    profile, plan, host = setup
    node = FakeNode(host, fail_job="resume")
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    sup = next(v for v in result["verdicts"] if v["class"] == "supervisor")
    assert sup["verdict"] == "fail" and "the supervisor stopped" in sup["figure"]


def test_the_7b_parts_are_judged_each_in_its_own_class(setup):
    """Issue 32 point 8: the 7B's train-only step (peak GPU memory per rank against the estimate) and its reload
    into engine-0, from what the node leaves; a broken step or reload fails its own class."""
    profile, plan, host = setup
    saved = lambda: json.loads((host / "rehearsal-report.json").read_text())  # noqa: E731
    rehearsal_run.run(profile, plan, read_now(), node=FakeNode(host), progress=lambda m: None)
    seven = saved()["evidence"]["seven_b"]
    assert seven["exit"] == 0 and seven["steps"] == 1
    assert seven["peak_gpu_gb"] == {"0": 100.66, "1": 100.66, "2": 100.66}  # 96,000 MiB, the peak of the samples
    assert seven["estimate_gb"] == pytest.approx(plan.seven_b.memory.trainer_gb, abs=1e-3)
    assert (host / "launch-7b-step.sh").is_file() and "7b" in saved()["evidence"]["phases"]
    oom = rehearsal_run.run(profile, plan, read_now(), node=FakeNode(host, step_exit=1), progress=lambda m: None)
    assert oom["first_failure"] == "seven_b_step"
    bad_reload = rehearsal_run.run(
        profile, plan, read_now(), node=FakeNode(host, reload_ok=False), progress=lambda m: None
    )
    assert bad_reload["first_failure"] == "seven_b_reload"
    with pytest.raises(StackError) as info:
        rehearsal_report.raise_on_failure(bad_reload)
    assert "update_weights_from_disk success=False" in info.value.message and "lm_head" in info.value.message


def test_without_the_7b_weights_the_7b_parts_fail_naming_make_model(setup, monkeypatch):
    profile, plan, host = setup

    def check(profile, *, cpu):
        if os.environ.get("MODEL_PATH") == "/models/Qwen2.5-7B-Instruct":
            raise StackError("the model weights are missing: run `make model` first.", ExitCode.ASSETS_MISSING)

    monkeypatch.setattr(assets, "check_before_up", check)
    node = FakeNode(host)
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert result["first_failure"] == "seven_b_step" and node.compose_calls == ["up", "down"]
    assert "make model" in next(v for v in result["verdicts"] if v["class"] == "seven_b_step")["figure"]


def test_a_failed_job_skips_the_7b_parts(setup):
    profile, plan, host = setup
    node = FakeNode(host, fail_job="train")
    result = rehearsal_run.run(profile, plan, read_now(), node=node, progress=lambda m: None)
    assert node.compose_calls == ["up", "down"] and not node.seven_b_commands
    row = next(v for v in result["verdicts"] if v["class"] == "seven_b_step")
    assert row["verdict"] == "fail" and "job train failed" in row["figure"]
