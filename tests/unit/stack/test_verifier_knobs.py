"""Issue 32 point 4: every knob of the code verifier reaches what Polar's test_command sees, with a value valid there.

On f6ba232 POLARSTACK_VERIFIER_ISOLATION (the opt-out the sandbox probe's sentence names) reached none of the places
the verifier runs from: the trainer's environment, launch.sh, the Ray job's env, the task template's runtime.env.
Now configs/stack.env holds it (and POLARSTACK_VERIFIER_CGROUP), the environment overrides it like every stack knob,
and the rendered plan carries it everywhere (polarstack.stack.verifier_knobs); POLARSTACK_VERIFIER_PYTHON, a host
path, is refused rather than passed into the SIF. An active opt-out is named by the in-job gate and the rehearsal
report; verify-offline (polarstack.offline.verifier_env) checks the rendered test_command's environment.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.offline import verifier_env, verify
from polarstack.paths import load_defaults
from polarstack.stack import profiles, verifier_knobs
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.resolved import read_now
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in (verifier_knobs.ISOLATION, verifier_knobs.CGROUP, verifier_knobs.PYTHON):
        monkeypatch.delenv(key, raising=False)


def rendered(profile: str = "engine-direct"):
    plan = build_plan(
        "humaneval", profiles.load(profile), run_id="knobs", config=load_defaults(), cluster=load_cluster()
    )
    template = yaml.safe_load(plan.files["polar_config.yaml"])["polar_task_template"]
    launch = dict(
        line.removeprefix("export ").split("=", 1)
        for line in plan.files["launch.sh"].splitlines()
        if line.startswith("export ") and "=" in line
    )
    submit = plan.commands[-1]
    job = json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]
    return template, launch, job


@pytest.mark.parametrize("value", ["namespaces", "none"])
def test_the_isolation_reaches_the_test_commands_runtime_env_launch_sh_and_the_ray_job(monkeypatch, value):
    if value == "none":
        monkeypatch.setenv(verifier_knobs.ISOLATION, "none")  # the environment overrides configs/stack.env
    template, launch, job = rendered()
    assert template["runtime"]["env"][verifier_knobs.ISOLATION] == value
    assert launch[verifier_knobs.ISOLATION] == value and job[verifier_knobs.ISOLATION] == value
    assert template["runtime"]["env"]["HOME"] == "/polar/session/home"  # the template's own env is kept
    # the trainer's environment (compose.yaml, rendered by the real Compose binary) and the rest, by verify-offline
    with tempfile.TemporaryDirectory() as tmp:
        check = verify.check_assets(profiles.load("engine-direct"), Path(tmp), read_now())
    assert check.ok, check.problems


def test_a_cgroup_under_sys_fs_cgroup_reaches_them_too_and_another_path_is_refused(monkeypatch):
    monkeypatch.setenv(verifier_knobs.CGROUP, "/sys/fs/cgroup/verifier")
    template, launch, job = rendered()
    assert template["runtime"]["env"][verifier_knobs.CGROUP] == "/sys/fs/cgroup/verifier"
    assert launch[verifier_knobs.CGROUP] == job[verifier_knobs.CGROUP] == "/sys/fs/cgroup/verifier"
    for bad in ("/tmp/my-cgroup", "/sys/fs/cgroup/../../etc"):
        monkeypatch.setenv(verifier_knobs.CGROUP, bad)
        with pytest.raises(StackError) as refused:
            rendered()
        assert refused.value.code == ExitCode.USAGE and "/sys/fs/cgroup/" in refused.value.message


def test_a_host_interpreter_and_an_unknown_mode_are_refused_not_passed_on(monkeypatch):
    monkeypatch.setenv(verifier_knobs.PYTHON, "/opt/venv/bin/python3")
    with pytest.raises(StackError) as refused:
        rendered()
    assert refused.value.code == ExitCode.USAGE and "SIF's own python3" in refused.value.message
    monkeypatch.delenv(verifier_knobs.PYTHON)
    monkeypatch.setenv(verifier_knobs.ISOLATION, "off")
    with pytest.raises(StackError) as refused:
        rendered()
    assert refused.value.code == ExitCode.USAGE and "namespaces, none" in refused.value.message


def test_verify_offline_finds_a_knob_that_does_not_reach_the_test_command(monkeypatch):
    monkeypatch.setenv(verifier_knobs.ISOLATION, "none")
    template, launch, job = rendered()
    trainer = {verifier_knobs.ISOLATION: "none", verifier_knobs.CGROUP: ""}
    assert verifier_env.problems(template, trainer, launch, job) == []
    old = copy.deepcopy(template)  # f6ba232's template: runtime.env without the knob
    del old["runtime"]["env"][verifier_knobs.ISOLATION]
    found = verifier_env.problems(old, trainer, launch, job)
    assert found and "runtime.env (Polar's test_command) has POLARSTACK_VERIFIER_ISOLATION=''" in found[0]
    assert verifier_env.problems(template, {}, launch, job)  # the trainer without it (f6ba232's compose.yaml)
    assert verifier_env.problems(template, trainer, {}, job)  # launch.sh without it
    assert verifier_env.problems(template, trainer, launch, {})  # the Ray job without it
    leaky = copy.deepcopy(template)
    leaky["runtime"]["env"][verifier_knobs.PYTHON] = "/usr/bin/python3"
    assert any(verifier_knobs.PYTHON in p for p in verifier_env.problems(leaky, trainer, launch, job))
    override = copy.deepcopy(template)
    override["evaluator"]["config"]["test_command"] += " --isolation namespaces"
    assert any("--isolation" in p for p in verifier_env.problems(override, trainer, launch, job))


def test_the_in_job_gate_names_an_active_opt_out_once(monkeypatch, capsys):
    from polarstack.train import gate

    monkeypatch.setenv(verifier_knobs.ISOLATION, "none")
    template, _, _ = rendered()
    args = SimpleNamespace(polar_task_template=template, polar_gate_delegate="x.y")
    assert "POLARSTACK_VERIFIER_ISOLATION=none is active" in gate.verifier_opt_out(args)
    on = copy.deepcopy(template)
    on["runtime"]["env"][verifier_knobs.ISOLATION] = "namespaces"
    monkeypatch.delenv(verifier_knobs.ISOLATION)
    assert gate.verifier_opt_out(SimpleNamespace(polar_task_template=on)) is None
    monkeypatch.setenv(verifier_knobs.ISOLATION, "none")  # the Ray job's env_vars alone say it too
    assert gate.verifier_opt_out(SimpleNamespace(polar_task_template=None)) is not None

    def delegate(*a, **k):
        raise RuntimeError("delegate reached")

    gate.reset()
    monkeypatch.setattr(gate, "first_rollout_check", lambda args: None)
    monkeypatch.setattr(gate, "_load", lambda path, args: delegate)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="delegate reached"):
            gate.generate_rollout_gated(args, 0, None)
    gate.reset()
    err = capsys.readouterr().err
    assert err.count("polarstack gate: WARNING POLARSTACK_VERIFIER_ISOLATION=none is active") == 1


def test_the_rehearsal_report_names_an_active_opt_out(monkeypatch, capsys):
    from polarstack.checks import rehearsal_report
    from polarstack.cli.render import render_rehearsal_report
    from polarstack.train import preflight, rehearsal_run

    monkeypatch.setenv(verifier_knobs.ISOLATION, "none")
    plan = preflight.build(profiles.load("engine-direct"), cluster=load_cluster())
    assert rehearsal_run.rendered_isolation(plan) == "none"
    evidence = {"reward_path": {"canonical_reward": 1.0, "wrong_reward": 0.0, "isolation": "none"}}
    result = rehearsal_report.report(evidence)
    assert result["verifier_isolation"] == "none" and "unisolated candidates" in result["warnings"][0]
    render_rehearsal_report({**result, "profile": "engine-direct", "plan": "p"})
    assert "WARNING POLARSTACK_VERIFIER_ISOLATION=none is active" in capsys.readouterr().out
    evidence["reward_path"]["isolation"] = "namespaces"
    assert rehearsal_report.report(evidence)["warnings"] == []
    monkeypatch.delenv(verifier_knobs.ISOLATION)
    assert (
        rehearsal_run.rendered_isolation(preflight.build(profiles.load("engine-direct"), cluster=load_cluster()))
        == "namespaces"
    )
