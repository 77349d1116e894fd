"""Issue 26 point 7: every documented smoke knob reaches the training job, with one deadline rule.

POLARSTACK_SMOKE_TOOL_PAD / POLARSTACK_SMOKE_TOOL_MAX_TOKENS (docs/tool-calls.md) and POLARSTACK_SMOKE_TIMEOUT ride in
the Ray job's runtime env, so the in-job first-rollout check reads what the host gate read; both take their deadline
from polarstack.checks.tool_exchange.smoke_deadline (the knob, else the rule for the request's token count with the
target's own need or 30 s as its floor). Under the supervisor:
a first-rollout check that got no answer (UNREACHABLE) is a crash, which the supervisor restarts, not a gate stop;
any other smoke failure is a GateAbort with its sentence in the abort file, never restarted."""

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from polarstack.checks import smoke, tool_exchange
from polarstack.errors import ExitCode, StackError
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.stack.target import Target
from polarstack.train import gate, launch, supervise
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit
KNOBS = {
    "POLARSTACK_SMOKE_TOOL_PAD": "0",
    "POLARSTACK_SMOKE_TOOL_MAX_TOKENS": "256",
    "POLARSTACK_SMOKE_TIMEOUT": "90",
    "POLARSTACK_SMOKE_AGENT_REQUEST": "/models/agent-request.json",
}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    gate.reset()
    yield
    gate.reset()


def runtime_env(plan):
    submit = plan.commands[-1]
    return json.loads(next(a for a in submit if a.startswith("--runtime-env-json=")).split("=", 1)[1])["env_vars"]


def test_the_documented_knobs_reach_the_ray_jobs_runtime_env(monkeypatch):
    profile = profiles.load("engine-direct")
    assert not set(KNOBS) & set(runtime_env(build_plan("humaneval", profile, run_id="x", cluster=load_cluster())))
    for name, value in KNOBS.items():
        monkeypatch.setenv(name, value)
    profile = profiles.load("engine-direct")  # as the site loads it: its settings hold the environment's knobs
    env = runtime_env(build_plan("humaneval", profile, run_id="x", cluster=load_cluster()))
    assert {k: env[k] for k in KNOBS} == KNOBS
    assert all(
        k in (build_plan("humaneval", profile, run_id="x", cluster=load_cluster()).files["launch.sh"]) for k in KNOBS
    )
    assert set(tool_exchange.SMOKE_KNOBS) == set(KNOBS)  # every knob the smoke reads from the environment
    # ... each a setting of the profile (resolved when it is loaded), how make train's gate and job, the demos and
    # the benches get them; the CLI's smoke reads its own environment, the in-job gate the job's
    assert set(KNOBS) <= set(profiles.ENVIRONMENT_KNOBS)
    assert tool_exchange.knobs_from(profile.settings) == tool_exchange.knobs_from(KNOBS)


def test_one_deadline_rule():
    assert tool_exchange.smoke_deadline() == tool_exchange.deadline_rule()["floor_seconds"] == 30.0
    assert tool_exchange.smoke_deadline(60.0) == 60.0  # what the target needs (the real sglang on a CPU)
    knob = tool_exchange.knobs_from({"POLARSTACK_SMOKE_TIMEOUT": "90"}).timeout  # as the caller read it
    assert tool_exchange.smoke_deadline(knob=knob) == tool_exchange.smoke_deadline(60.0, knob=knob) == 90.0
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(StackError) as info:
            tool_exchange.smoke_deadline(knob=bad)
        assert info.value.code == ExitCode.USAGE and "POLARSTACK_SMOKE_TIMEOUT" in info.value.message


def _capture(monkeypatch, code=ExitCode.OK, message="ok"):
    seen = {}

    def fake(target, options):
        seen.update(asdict(options))
        return SimpleNamespace(ok=code == ExitCode.OK, code=code, message=message)

    monkeypatch.setattr(smoke, "run_smoke", fake)
    return seen


def job_args(tmp_path):
    return SimpleNamespace(polar_gate_base_url="http://127.0.0.1:30000", polar_gate_abort_file=str(tmp_path / "abort"))


@pytest.mark.parametrize("env, expected", [(None, 30.0), ("90", 90.0)])
def test_the_host_gate_and_the_in_job_check_share_the_deadline(tmp_path, monkeypatch, env, expected):
    if env:
        monkeypatch.setenv("POLARSTACK_SMOKE_TIMEOUT", env)
    seen = _capture(monkeypatch)
    gate.first_rollout_check(job_args(tmp_path))
    in_job = seen.pop("timeout")
    profile = profiles.load("engine-direct")
    plan = build_plan("humaneval", profile, run_id="x", cluster=load_cluster())
    target = Target("docker", profile.name, profile.base_url(), profile.route, loaded=profile)
    launch.host_gate(launch.TrainRequest(task="humaneval"), target, plan, profile)
    assert in_job == seen.get("timeout") == expected  # the host gate passed its own (before: none, run_smoke's 10 s)


def test_no_answer_in_the_first_rollout_check_is_a_crash_the_supervisor_restarts(tmp_path, monkeypatch):
    _capture(monkeypatch, ExitCode.UNREACHABLE, "no answer from http://127.0.0.1:30000 within 30 s")
    a = job_args(tmp_path)
    with pytest.raises(RuntimeError) as info:
        gate.first_rollout_check(a)
    assert not isinstance(info.value, gate.GateAbort) and "POLARSTACK_SMOKE_TIMEOUT" in str(info.value)
    assert not (tmp_path / "abort").exists()
    results = iter([1, 0])  # the job crashed at its first rollout, then ran
    outcome = supervise.supervise(
        lambda resume: next(results),
        lambda: None,
        lambda: (tmp_path / "abort").read_text() if (tmp_path / "abort").exists() else None,
        max_restarts=1,
        resume=False,
        describe="the job",
        logs="the logs",
        log=lambda m: None,
    )
    assert [a["exit"] for a in outcome.attempts] == [1, 0]


def test_a_path_defect_in_the_first_rollout_check_is_a_final_gate_stop(tmp_path, monkeypatch):
    _capture(monkeypatch, ExitCode.TOKENS_MISSING, "the router dropped return_prompt_token_ids")
    a = job_args(tmp_path)
    with pytest.raises(gate.GateAbort):
        gate.first_rollout_check(a)
    assert "return_prompt_token_ids" in (tmp_path / "abort").read_text()
    with pytest.raises(StackError) as info:
        supervise.supervise(
            lambda resume: 1,
            lambda: None,
            lambda: (tmp_path / "abort").read_text().strip(),
            max_restarts=1,
            resume=False,
            describe="the job",
            logs="the logs",
            log=lambda m: None,
        )
    assert info.value.code == ExitCode.GATE
