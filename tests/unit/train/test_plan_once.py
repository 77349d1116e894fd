"""Issue 35 point 4, "the plan built once": one `make train` (`polarstack train`, the dry run and the launch on the
docker runtime driven with the repository's fakes) builds its plan once (build_plan), reads configs/train/defaults.yaml
once (load_defaults), checks its TASK once (check_task) and reads the cluster once (the site, polarstack.cli.site and its reads in stack.resolved;
every later step reads plan.cluster); launch-resume.sh is the one plan resumed (resume_variant), which is what build_plan renders with
resume=True."""

from __future__ import annotations

import subprocess
import sys

import pytest

from polarstack import paths
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.reward.tasks import TASKS
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import compose, profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import plan as train_plan
from polarstack.train.plan import build_plan, resume_variant
from train_fakes import TRAIN_ARGS, fake_node_for_train

pytestmark = pytest.mark.unit


def counted(monkeypatch, function) -> list[str]:
    """Replace `function` in every loaded polarstack module that holds it (its home and each from-import of it) by a
    wrapper that records the calling module's name; returns the record."""
    callers: list[str] = []

    def counting(*args, **kwargs):
        callers.append(sys._getframe(1).f_globals.get("__name__", "?"))
        return function(*args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("polarstack"):
            for name, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, name, counting)
    return callers


@pytest.fixture
def calls(monkeypatch, tmp_path):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    return {
        "build_plan": counted(monkeypatch, train_plan.build_plan),
        "load_defaults": counted(monkeypatch, paths.load_defaults),
        "check_task": counted(monkeypatch, train_plan.check_task),
        "cluster": counted(monkeypatch, cluster_mod.load),
    }


def assert_once(calls) -> None:
    assert calls["build_plan"] == ["polarstack.train.launch"], calls["build_plan"]
    assert len(calls["load_defaults"]) == 1, calls["load_defaults"]
    assert calls["check_task"] == ["polarstack.train.launch"], calls["check_task"]
    # the site reads the cluster once for the command (polarstack.cli.site.Site, its reads in
    # polarstack.stack.resolved.ReadOnce) and train/ takes it from there; stack/ still reads it where it renders
    # Compose's files (tests/static/test_site_reads.py's tolerated set)
    site_or_train = ("polarstack.train", "polarstack.cli", "polarstack.stack.resolved")
    assert [c for c in calls["cluster"] if c.startswith(site_or_train)] == ["polarstack.stack.resolved"], calls


def test_the_dry_run_plans_once(calls, capsys):
    assert main(["train", "--task", "humaneval", "--dry-run", "--json"]) == 0, capsys.readouterr().err
    assert_once(calls)


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_the_launch_plans_once_and_its_resume_script_is_the_plan_resumed(calls, monkeypatch, tmp_path, capsys, resume):
    fake_node_for_train(monkeypatch, tmp_path)
    seen = {}

    def trainer(profile, args, **kw):
        if "df" in args:
            return subprocess.CompletedProcess(args, 0, "     Avail\n10000000000000\n", "")
        if "polarstack.train.ray_job" in args:
            return subprocess.CompletedProcess(args, 0, "[]\n", "")
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(compose, "run_compose", trainer)
    monkeypatch.setattr("polarstack.train.launch.resume_engines", lambda profile, cluster: seen.update(c=cluster) or [])
    assert main([*TRAIN_ARGS, *resume]) == 0, capsys.readouterr().err
    assert_once(calls)
    assert seen["c"] == cluster_mod.load() and not seen["c"].multi  # the attempt's helpers get the plan's cluster
    (run,) = (tmp_path / "run" / "train").iterdir()
    script, again = (run / "launch.sh").read_text(), (run / "launch-resume.sh").read_text()
    if resume:
        assert again == script
    else:
        assert again != script and "RESUME=1 found no checkpoint" in again and " --load " in again


@pytest.mark.parametrize("name", ["engine-direct", "router-passthrough", "patched-router", "stock-router"])
@pytest.mark.parametrize("task", TASKS)
def test_the_resume_variant_is_what_build_plan_renders_resumed(name, task):
    profile = profiles.load(name)
    config = paths.load_defaults()
    fresh = build_plan(task, profile, run_id="r", config=config, cluster=load_cluster())
    resumed = resume_variant(fresh)
    again = build_plan(task, profile, run_id="r", config=config, resume=True, cluster=load_cluster())
    assert resumed.as_dict() == again.as_dict()
    assert resumed.train_args == again.train_args and resumed.files == again.files
    assert not fresh.resume and "--load" not in fresh.train_args  # the plan it came from is unchanged
    assert resume_variant(again) is again


def test_an_unknown_task_is_refused_before_anything_else(calls, capsys):
    assert main(["train", "--task", "nope", "--runtime", "docker"]) == ExitCode.USAGE
    assert "choose one of humaneval, mbpp" in capsys.readouterr().err
    assert calls["check_task"] == ["polarstack.train.launch"] and calls["build_plan"] == []
