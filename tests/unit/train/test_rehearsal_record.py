"""Pins `make train`'s rehearsal check on the docker runtime (issue 19): without a passing `make preflight` record
whose hash matches the pins, the profile and the rehearsal's plan, it refuses with NO_REHEARSAL (17) in one
sentence; a changed pin, a failed rehearsal or a rehearsal of another plan (SET overrides) refuse too; the
explicit override (ALLOW_NO_PREFLIGHT=1, --without-rehearsal) launches with a warning; a match prints its age."""

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import rehearsal_record

pytestmark = pytest.mark.unit
PASSED = {"passed": True}


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def refused(profile, **kw):
    with pytest.raises(StackError) as info:
        rehearsal_record.require(profile, cluster=load_cluster(), override=False, **kw)
    assert info.value.code == ExitCode.NO_REHEARSAL
    return info.value.message


def test_no_record_refuses_and_the_override_launches():
    profile = profiles.load("engine-direct")
    assert "no rehearsal of profile engine-direct" in refused(profile)
    assert "WARNING" in rehearsal_record.require(profile, override=True, cluster=load_cluster())


def test_a_matching_pass_prints_its_age():
    profile = profiles.load("patched-router")
    rehearsal_record.write(profile, PASSED, ".run/train/x/rehearsal-report.json", now=1000.0, cluster=load_cluster())
    line = rehearsal_record.require(profile, override=False, now=1000.0 + 2 * 3600, cluster=load_cluster())
    assert "passed 2.0 h ago" in line


def test_a_changed_pin_refuses(monkeypatch):
    profile = profiles.load("engine-direct")
    rehearsal_record.write(profile, PASSED, "r", now=0.0, cluster=load_cluster())
    rehearsal_record.require(profile, override=False, now=60.0, cluster=load_cluster())  # same pins: passes
    changed = {**pins(), "SGLANG_VERSION": "0.5.16"}
    monkeypatch.setattr(rehearsal_record, "pins", lambda: changed)
    assert "other pins, profile values or plan" in refused(profile, now=60.0)


def test_a_failed_rehearsal_or_another_plan_refuses():
    profile = profiles.load("router-passthrough")
    rehearsal_record.write(profile, {"passed": False}, "r", cluster=load_cluster())
    assert "failed" in refused(profile)
    rehearsal_record.write(profile, PASSED, "r", sets=["grpo.lr=2.0e-6"], cluster=load_cluster())
    assert "other pins" in refused(profile)


def test_make_train_on_docker_refuses_with_exit_17(monkeypatch, capsys):
    monkeypatch.setattr("polarstack.stack.compose.check_node", lambda *a, **kw: None)
    monkeypatch.setattr(
        "polarstack.stack.docker_state.usable", lambda requested, where, **_: {"profile": "engine-direct"}
    )
    assert main(["train", "--task", "humaneval", "--runtime", "docker"]) == ExitCode.NO_REHEARSAL
    err = capsys.readouterr().err
    assert "make preflight PROFILE=engine-direct" in err and len(err.strip().splitlines()) == 1
    # dry runs and the local runtime never ask for a rehearsal
    assert main(["train", "--task", "humaneval", "--runtime", "docker", "--dry-run", "--json"]) == 0


def test_a_changed_stack_knob_refuses_but_the_model_path_does_not(monkeypatch):
    profile = profiles.load("patched-router")
    rehearsal_record.write(profile, PASSED, "r", now=0.0, cluster=load_cluster())
    monkeypatch.setenv("MODEL_PATH", "/models/Qwen2.5-7B-Instruct-other")  # the rehearsal serves its own model
    rehearsal_record.require(profile, override=False, now=1.0, cluster=load_cluster())
    monkeypatch.setenv("ENGINE_TOOL_CALL_PARSER", "hermes")
    assert "other pins" in refused(profile, now=1.0)
