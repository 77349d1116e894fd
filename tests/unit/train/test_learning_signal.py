"""Pins the in-job learning-signal watch (issue 19): per group the trainable tokens, rewards, sessions with tool
calls, clipped and dropped traces as Polar's adapter marks them; the rollout's metrics added to what slime logs
to its tracker; the zero-advantage watch, which warns above gate.zero_advantage_warn_share over K rollouts and
stops the job as a GATE stop (the abort file written) when every group of K consecutive rollouts has zero
advantage, whatever the reward; one mixed group resets it."""

from types import SimpleNamespace

import pytest
import yaml

import rehearsal_fakes as fakes
from polarstack.paths import train_defaults
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import gate, learning_signal

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def fresh_gate():
    gate.reset()
    gate.gate_state.checked = True  # the first-rollout smoke is tested elsewhere
    yield
    gate.reset()


def args(tmp_path, **extra):
    values = {
        "polar_gate_delegate": "fake_bridge.rollout",
        "polar_gate_abort_file": str(tmp_path / "gate-abort.txt"),
        "polar_gate_summary_file": str(tmp_path / "rollouts.jsonl"),
        "polar_gate_zero_advantage_rollouts": 3,
        "polar_gate_zero_advantage_warn_share": 0.5,
        "polar_gate_max_zero_token_groups": 3,
        "polar_gate_watchdog_seconds": 60,
        "rollout_batch_size": 2,
    }
    return SimpleNamespace(**{**values, **extra})


def run(monkeypatch, a, rollouts):
    """rollouts: per rollout, the groups the delegate returns; returns the outputs."""
    import sys
    import types

    outputs = []
    module = types.ModuleType("fake_bridge")
    monkeypatch.setitem(sys.modules, "fake_bridge", module)
    for rollout_id, groups in enumerate(rollouts):
        output = SimpleNamespace(samples=groups, metrics={})
        module.rollout = lambda *x, output=output, **k: output
        outputs.append(gate.generate_rollout_gated(a, rollout_id, None))
    return outputs


def test_group_summary_reads_polar_adapter_marks():
    group = [
        fakes.sample(1.0, session="a"),
        fakes.sample(0.0, tool=False, session="b"),
        fakes.sample(0.0, clipped=True, session="b"),
        fakes.sample(placeholder=True, tool=False, session="c"),
        fakes.sample(0.0, tool=False, invalid=True, session="d"),
    ]
    row = learning_signal.group_summary(group, gate.sample_reward, gate.trainable_tokens)
    assert row["sessions"] == 4 and row["sessions_with_tool_calls"] == 2  # a, b (its second trace called a tool)
    assert (row["clipped"], row["placeholders"], row["parser_invalid_tool_calls"]) == (1, 1, 1)
    assert row["rewards"] == [1.0, 0.0, 0.0, 0.0] and not row["zero_advantage"]  # the placeholder is removed
    assert row["trainable_tokens"] == 12


def test_metrics_reach_slimes_tracker_and_the_summary_file(tmp_path, monkeypatch):
    a = args(tmp_path)
    (out,) = run(monkeypatch, a, [fakes.mixed_groups()])
    assert out.metrics["polarstack/zero_advantage_share"] == 0.0 and out.metrics["polarstack/reward_mean"] == 0.5
    assert out.metrics["polarstack/trainable_tokens_per_group"] == 12.0
    line = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(line) == 1 and '"rollout_id": 0' in line[0]


@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_k_rollouts_of_zero_advantage_stop_the_job(tmp_path, monkeypatch, reward):
    a = args(tmp_path)
    same = [[fakes.sample(reward) for _ in range(4)] for _ in range(2)]
    with pytest.raises(gate.GateAbort) as info:
        run(monkeypatch, a, [same, same, same])
    assert "zero advantage" in str(info.value)
    assert "zero advantage" in (tmp_path / "gate-abort.txt").read_text()  # polarstack train reports it as GATE


def test_one_mixed_group_keeps_the_job_and_warns_above_the_share(tmp_path, monkeypatch, capsys):
    a = args(tmp_path)
    same = [[fakes.sample(1.0) for _ in range(4)] for _ in range(2)]
    mostly = [[fakes.sample(1.0) for _ in range(4)], [fakes.sample(1.0), fakes.sample(0.0)]]
    run(monkeypatch, a, [same, same, mostly, same])
    assert not (tmp_path / "gate-abort.txt").exists()
    err = capsys.readouterr().err
    assert "WARNING" in err and "groups of the last 3 rollouts" in err and "have zero advantage" in err


def test_zero_switches_the_stop_off(tmp_path, monkeypatch):
    a = args(tmp_path, polar_gate_zero_advantage_rollouts=0)
    same = [[fakes.sample(1.0) for _ in range(4)]]
    run(monkeypatch, a, [same] * 5)
    assert not (tmp_path / "gate-abort.txt").exists()


def test_knobs_are_documented_defaults_and_reach_the_job():
    gate_section = yaml.safe_load(train_defaults().read_text())["gate"]
    assert gate_section["zero_advantage_rollouts"] == learning_signal.DEFAULT_ZERO_ADVANTAGE_ROLLOUTS
    assert gate_section["zero_advantage_warn_share"] == learning_signal.DEFAULT_ZERO_ADVANTAGE_WARN_SHARE
    assert "zero_reward_rollouts, which stops sooner" in train_defaults().read_text()  # how the two stops relate
    from polarstack.stack import profiles
    from polarstack.train.plan import build_plan

    plan = build_plan("humaneval", profiles.load("engine-direct"), run_id="x", cluster=load_cluster())
    config = yaml.safe_load(plan.files["polar_config.yaml"])
    assert config["polar_gate_zero_advantage_rollouts"] == 10 and config["polar_gate_summary_file"].endswith(
        "/x/rollouts.jsonl"
    )


def test_sessions_polar_masks_and_those_ended_at_the_context_are_counted_once_each():
    """Issue 26 points 2 and 4: Polar's adapter marks a failed session (session_error, FAILED) and a timed-out one
    (session_timeout, ABORTED); a session whose error is sglang's context refusal ended at the limit."""
    group = [
        fakes.sample(1.0, session="a"),
        fakes.sample(outcome="failed", session="b"),
        fakes.sample(0.0, session="b"),  # a second trace of b: the session still failed
        fakes.sample(outcome="timed_out", session="c"),
        fakes.sample(outcome="context_limit", session="d"),
    ]
    row = learning_signal.group_summary(group, gate.sample_reward, gate.trainable_tokens)
    assert (row["sessions_failed"], row["sessions_timed_out"], row["sessions_at_context_limit"]) == (1, 1, 1)
    assert learning_signal.session_shares([row]) == {"failed": 0.25, "timed_out": 0.25, "at_context_limit": 0.25}
    # the model's own text quoting the sentence is not a refusal
    quoting = fakes.sample(1.0)
    quoting.metadata["polar"]["trace_debug"]["response_messages"][0]["content"] = fakes.CONTEXT_REFUSAL
    assert learning_signal.session_outcome(quoting) == "ok"


def test_the_in_job_watch_records_polar_drops_and_warns_at_the_context_limit(tmp_path, monkeypatch, capsys):
    import json
    import sys
    import types

    a = args(tmp_path, polar_gate_context_limit_warn_share=0.2)
    module = types.ModuleType("fake_bridge")
    monkeypatch.setitem(sys.modules, "fake_bridge", module)
    groups = [[fakes.sample(1.0), fakes.sample(0.0), fakes.sample(outcome="context_limit")]]
    metrics = {"polar/dropped_low_complete_fraction_groups_delta": 2.0, "polar/dropped_failed_groups_delta": 1.0}
    output = SimpleNamespace(samples=groups, metrics=dict(metrics))
    module.rollout = lambda *x, **k: output
    out = gate.generate_rollout_gated(a, 0, None)
    assert out.metrics["polarstack/sessions_at_context_limit_share"] == pytest.approx(1 / 3)
    err = capsys.readouterr().err
    assert "WARNING 1 sessions of rollout 0 (33%, above 20%) ended at the engine's context" in err
    row = json.loads((tmp_path / "rollouts.jsonl").read_text().splitlines()[0])
    assert row["polar_dropped"]["low_complete_fraction"] == 2.0 and row["polar_dropped"]["failed"] == 1.0
    assert not (tmp_path / "gate-abort.txt").exists()  # a warning, not a stop
    a.polar_gate_context_limit_warn_share = 0.5
    gate.reset()
    gate.gate_state.checked = True
    gate.generate_rollout_gated(a, 1, None)
    assert "ended at the engine's context" not in capsys.readouterr().err
