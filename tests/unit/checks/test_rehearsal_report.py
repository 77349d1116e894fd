"""Pins each verdict of the rehearsal's report both ways (issue 19), against fakes of slime's log lines and Polar's
samples built from the recorded upstream lines (tests/rehearsal_fakes.py): a passing rehearsal passes every class;
each broken stack fails its own class first, exits REHEARSAL_FAILED naming it and what to change; a model
shortfall (no tool call, no mixed rewards) or a slow rehearsal only warns."""

import copy
import json

import pytest

import rehearsal_fakes as fakes
from polarstack.checks import rehearsal_report
from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.offline import rehearsal_keys

pytestmark = pytest.mark.unit


def verdicts(evidence):
    return {v.name: v for v in rehearsal_report.judge(evidence)}


def test_a_passing_rehearsal_passes_every_class():
    result = rehearsal_report.report(fakes.passing_evidence())
    assert result["passed"], result
    assert [v["class"] for v in result["verdicts"]] == list(rehearsal_report.CLASSES)
    assert {v["verdict"] for v in result["verdicts"]} == {"pass"}
    rehearsal_report.raise_on_failure(result)  # no exception


def _rollouts(groups, dropped=0):
    return [{**fakes.summary(r, groups, dropped), "phase": "train" if r < 2 else "resume"} for r in range(3)]


def broken(name):
    e = copy.deepcopy(fakes.passing_evidence())
    if name == "trainable_tokens":
        e["rollouts"] = _rollouts([[fakes.sample(1.0, trainable=False)] * 4] + fakes.mixed_groups())
    elif name == "trainable_tokens_dropped":
        e["rollouts"] = _rollouts(fakes.mixed_groups(), dropped=2)
    elif name == "tool_calls":
        e["rollouts"] = _rollouts([[fakes.sample(r, tool=False, invalid=True) for r in (1.0, 0.0)]] * 3)
    elif name == "length":
        e["rollouts"] = _rollouts([[fakes.sample(r, clipped=True) for r in (1.0, 0.0, 1.0)]] * 3)
    elif name == "loss_and_grad":
        e["slime"] = rehearsal_report.parse_slime_log(
            "\n".join(fakes.step_line(s, loss=float("nan")) for s in range(3))
        )
    elif name == "grad_zero":
        e["slime"] = rehearsal_report.parse_slime_log("\n".join(fakes.step_line(s, grad=0.0) for s in range(3)))
    elif name == "missing_steps":
        e["slime"] = rehearsal_report.parse_slime_log(fakes.step_line(0))
    elif name == "weight_sync":
        e["weight_versions"]["before"]["http://127.0.0.1:30010"] = "default"
        e["weight_versions"]["after_train"]["http://127.0.0.1:30010"] = "default"
        e["weight_versions"]["after_resume"]["http://127.0.0.1:30010"] = "3"
    elif name == "checkpoint_resume":
        e["checkpoint"]["after_resume"] = "1"
    elif name == "resume_restarted":
        e["rollouts"][2]["rollout_id"] = 0  # job 2 started again at rollout 0: the --load fell back to --ref-load
    return e


@pytest.mark.parametrize(
    "case, failing",
    [
        ("trainable_tokens", "trainable_tokens"),
        ("trainable_tokens_dropped", "trainable_tokens"),
        ("tool_calls", "tool_calls"),
        ("length", "length"),
        ("loss_and_grad", "loss_and_grad"),
        ("grad_zero", "loss_and_grad"),
        ("missing_steps", "loss_and_grad"),
        ("weight_sync", "weight_sync"),
        ("checkpoint_resume", "checkpoint_resume"),
        ("resume_restarted", "checkpoint_resume"),
    ],
)
def test_a_broken_stack_fails_its_class(case, failing):
    result = rehearsal_report.report(broken(case))
    assert not result["passed"] and result["first_failure"] == failing
    with pytest.raises(StackError) as info:
        rehearsal_report.raise_on_failure(result)
    assert info.value.code == ExitCode.REHEARSAL_FAILED and failing in info.value.message
    row = next(v for v in result["verdicts"] if v["class"] == failing)
    assert row["change"] and row["change"] in info.value.message  # what to change is in the sentence


def test_no_rollout_at_all_fails_first_at_trainable_tokens():
    e = fakes.passing_evidence()
    e["rollouts"] = []
    assert rehearsal_report.report(e)["first_failure"] == "trainable_tokens"


def test_a_model_that_never_calls_a_tool_is_a_warning():
    e = fakes.passing_evidence()
    e["rollouts"] = _rollouts([[fakes.sample(r, tool=False) for r in (1.0, 0.0)]] * 3)
    result = rehearsal_report.report(e)
    v = verdicts(e)["tool_calls"]
    assert result["passed"] and v.verdict == "warn" and "model shortfall" in v.change


def test_no_mixed_rewards_is_a_model_shortfall_when_the_canonical_answer_gets_reward_one():
    """Issue 26 point 2: "no group with mixed rewards in any step" is its own class: a model shortfall (a warning)
    when the verifier gave the canonical answer reward 1 through the same sandbox, and the zero gradient of those
    steps is that class, not a loss defect."""
    e = fakes.passing_evidence()
    e["rollouts"] = _rollouts([[fakes.sample(0.0) for _ in range(4)]] * 3)
    e["slime"] = rehearsal_report.parse_slime_log(
        "\n".join(fakes.step_line(s, grad=0.0, pg_loss=0.0) for s in range(3))
    )
    v = verdicts(e)
    assert v["no_mixed_rewards"].verdict == "warn" and "never solved a task" in v["no_mixed_rewards"].change
    assert "reward 1" in v["no_mixed_rewards"].change and "0/3 rollouts" in v["no_mixed_rewards"].figure
    assert v["reward_spread"].verdict == "warn" and "no_mixed_rewards" in v["reward_spread"].change
    assert v["loss_and_grad"].verdict == "pass" and "zero advantages" in v["loss_and_grad"].figure
    assert rehearsal_report.report(e)["passed"]
    assert verdicts(fakes.passing_evidence())["reward_spread"].verdict == "pass"


def test_no_mixed_rewards_without_a_working_reward_path_fails_as_its_own_class():
    e = fakes.passing_evidence()
    e["rollouts"] = _rollouts([[fakes.sample(0.0) for _ in range(4)]] * 3)
    e["slime"] = rehearsal_report.parse_slime_log("\n".join(fakes.step_line(s, grad=0.0) for s in range(3)))
    for path in (None, {"task": "HumanEval/0", "canonical_reward": 0.0, "wrong_reward": 0.0}):
        e["reward_path"] = path
        result = rehearsal_report.report(e)
        assert result["first_failure"] == "no_mixed_rewards", result
        assert "reward path is broken" in verdicts(e)["no_mixed_rewards"].change


def _solved_alike(**step):
    e = fakes.passing_evidence()
    e["rollouts"] = _rollouts([[fakes.sample(1.0) for _ in range(4)]] * 3)  # solved alike: every advantage 0
    e["slime"] = rehearsal_report.parse_slime_log("\n".join(fakes.step_line(s, **step) for s in range(3)))
    return e


def test_a_gradient_from_the_kl_term_with_no_mixed_rewards_passes_when_the_policy_loss_is_zero():
    """Issue 32 point 7: with every advantage 0 the KL term still moves the grad norm (the reference pass and the
    training pass differ numerically); the policy-gradient loss is -ratio x 0 and is what is judged."""
    working = _solved_alike(grad=0.03, pg_loss=0.0)
    v = verdicts(working)["loss_and_grad"]
    assert v.verdict == "pass" and "policy-gradient loss of 0 within 1e-06" in v.figure, v
    assert rehearsal_report.report(working)["passed"]  # no_mixed_rewards warns: the reward path is proven
    assert verdicts(_solved_alike(grad=0.03, pg_loss=4e-7))["loss_and_grad"].verdict == "pass"  # float reductions


def test_a_policy_loss_with_no_mixed_rewards_is_a_defect():
    broken_stack = _solved_alike(grad=0.5, pg_loss=0.02)  # advantages that are not what the rewards say
    result = rehearsal_report.report(broken_stack)
    assert result["first_failure"] == "loss_and_grad"
    assert "train/pg_loss 0.02 with no mixed rewards" in verdicts(broken_stack)["loss_and_grad"].figure
    tighter = _solved_alike(grad=0.03, pg_loss=4e-7)
    tighter["zero_advantage_pg_loss_tolerance"] = 1e-7
    assert verdicts(tighter)["loss_and_grad"].verdict == "fail"


def test_without_a_logged_policy_loss_a_non_zero_gradient_with_no_mixed_rewards_is_a_defect():
    e = _solved_alike(grad=0.5, pg_loss=None)
    assert rehearsal_report.report(e)["first_failure"] == "loss_and_grad"
    assert "no train/pg_loss logged" in verdicts(e)["loss_and_grad"].figure


def test_a_logprob_difference_above_slimes_ci_bound_fails_its_own_class():
    """slime's train/train_rollout_logprob_abs_diff (loss.py l.1074-1088) above 0.1 (its --ci-test bound)."""
    working = fakes.passing_evidence()  # the fakes log 0.02
    assert verdicts(working)["logprob_mismatch"].verdict == "pass"
    at_bound = fakes.passing_evidence()
    at_bound["slime"] = rehearsal_report.parse_slime_log(
        "\n".join(fakes.step_line(s, logprob_diff=0.1) for s in range(3))
    )
    assert verdicts(at_bound)["logprob_mismatch"].verdict == "pass"
    broken_stack = fakes.passing_evidence()
    broken_stack["slime"] = rehearsal_report.parse_slime_log(
        "\n".join(fakes.step_line(s, logprob_diff=0.1 if s < 2 else 0.35) for s in range(3))
    )
    result = rehearsal_report.report(broken_stack)
    assert result["first_failure"] == "logprob_mismatch", result
    v = verdicts(broken_stack)["logprob_mismatch"]
    assert "above 0.1 at step(s) 2" in v.figure and "other weights" in v.change
    with pytest.raises(StackError) as info:
        rehearsal_report.raise_on_failure(result)
    assert "failed at logprob_mismatch" in info.value.message
    unlogged = fakes.passing_evidence()
    unlogged["slime"] = rehearsal_report.parse_slime_log(
        "\n".join(fakes.step_line(s, logprob_diff=None) for s in range(3))
    )
    assert verdicts(unlogged)["logprob_mismatch"].verdict == "warn"
    assert rehearsal_report.report(unlogged)["passed"]
    assert rehearsal_report.DEFAULT_MAX_LOGPROB_DIFF == float(
        rehearsal_keys.record()["slime"]["facts"]["logprob_abs_diff_ci_bound"]["key"]
    )


def test_a_zero_gradient_with_mixed_rewards_is_a_defect():
    e = broken("grad_zero")
    assert "zero gradient norm with mixed rewards" in verdicts(e)["loss_and_grad"].figure


def test_failed_and_timed_out_sessions_fail_the_sessions_class():
    e = fakes.passing_evidence()
    bad = [fakes.sample(1.0), fakes.sample(0.0), fakes.sample(outcome="failed"), fakes.sample(outcome="timed_out")]
    e["rollouts"] = _rollouts([bad] * 3)
    result = rehearsal_report.report(e)
    assert result["first_failure"] == "sessions"
    assert "9/36 sessions failed, 9 timed out (50%" in verdicts(e)["sessions"].figure
    e["max_failed_session_share"] = 0.6
    assert verdicts(e)["sessions"].verdict == "pass"


def test_groups_polar_dropped_for_too_few_completed_sessions_fail_the_sessions_class_above_the_share():
    """Issue 32 point 7: one dropped group of ten warns (a working stack may lose one); above
    report.max_dropped_group_share (default 25%) the class fails."""
    e = fakes.passing_evidence()
    metrics = {"polar/dropped_low_complete_fraction_groups_delta": 1.0, "polar/dropped_sessions_delta": 4.0}
    e["rollouts"][1] = {**fakes.summary(1, fakes.mixed_groups(), polar_metrics=metrics), "phase": "train"}
    result = rehearsal_report.report(e)
    v = verdicts(e)["sessions"]
    assert result["passed"] and v.verdict == "warn", result
    assert "PolarLowCompleteAcceptFractionError" in v.figure and "(10% of 10 groups)" in v.figure
    metrics["polar/dropped_low_complete_fraction_groups_delta"] = 4.0  # 4 of 13 groups: 31%
    e["rollouts"][1] = {**fakes.summary(1, fakes.mixed_groups(), polar_metrics=metrics), "phase": "train"}
    assert rehearsal_report.report(e)["first_failure"] == "sessions"
    assert "dropped 31% > 25%" in verdicts(e)["sessions"].figure
    e["max_dropped_group_share"] = 0.5
    assert verdicts(e)["sessions"].verdict == "warn"


def test_one_group_dropped_for_zero_trainable_tokens_warns_and_more_than_the_share_fails():
    e = fakes.passing_evidence()
    e["rollouts"][0] = {**fakes.summary(0, fakes.mixed_groups(), dropped=1), "phase": "train"}
    v = verdicts(e)["trainable_tokens"]
    assert rehearsal_report.report(e)["passed"] and v.verdict == "warn", v
    assert "1 of 10 groups dropped by Polar for zero trainable tokens (10%)" in v.figure
    assert rehearsal_report.report(broken("trainable_tokens_dropped"))["first_failure"] == "trainable_tokens"


def test_sessions_ended_at_the_context_limit_warn_then_fail():
    e = fakes.passing_evidence()
    few = [fakes.sample(1.0), fakes.sample(0.0), fakes.sample(1.0), fakes.sample(0.0), fakes.sample(0.0)]
    e["rollouts"] = _rollouts([few, few[:4], few[:4] + [fakes.sample(outcome="context_limit")]])
    v = verdicts(e)["context_limit"]
    assert v.verdict == "warn" and v.figure.startswith("3/42 sessions ended at the engine's context")
    e["max_failed_session_share"] = 1.0
    e["rollouts"] = _rollouts([[fakes.sample(1.0), fakes.sample(0.0), fakes.sample(outcome="context_limit")]] * 3)
    assert rehearsal_report.report(e)["first_failure"] == "context_limit"


def test_a_supervisor_that_did_not_restart_fails_its_class():
    e = fakes.passing_evidence()
    e["supervisor"] = {"injected_exit": 75, "attempts": [{"resume": True, "exit": 0, "checkpoint": None}]}
    assert rehearsal_report.report(e)["first_failure"] == "supervisor"
    del e["supervisor"]
    assert "did not run through the supervisor" in verdicts(e)["supervisor"].figure


def test_a_rehearsal_over_the_time_goal_warns():
    e = fakes.passing_evidence()
    e["phases"] = {"up": 600.0, "train": 600.0, "resume": 300.0}
    assert verdicts(e)["time_and_tokens"].verdict == "warn"
    assert "tokens per rollout 72, 72, 72" in verdicts(fakes.passing_evidence())["time_and_tokens"].figure


def test_slime_log_parser_reads_non_finite_values_and_skips_other_lines():
    text = "\n".join(
        [fakes.step_line(4, loss=float("inf")), "step 5: not a dict", fakes.perf_line(1), "critic-step 3: {}"]
    )
    parsed = rehearsal_report.parse_slime_log(text)
    assert [s["step"] for s in parsed["steps"]] == [4] and parsed["steps"][0]["train/loss"] == float("inf")
    assert parsed["perf"][0]["perf/rollout_time"] == 60.0


def test_cli_shows_a_report_and_exits_by_its_verdict(tmp_path, capsys):
    path = tmp_path / "rehearsal-report.json"
    path.write_text(json.dumps(rehearsal_report.report(broken("weight_sync"))))
    assert main(["preflight", "--report", str(path), "--json"]) == ExitCode.REHEARSAL_FAILED
    out, err = capsys.readouterr()
    assert json.loads(out)["first_failure"] == "weight_sync" and "failed at weight_sync" in err
    path.write_text(json.dumps(rehearsal_report.report(fakes.passing_evidence())))
    assert main(["preflight", "--report", str(path)]) == 0
    assert "rehearsal passed" in capsys.readouterr().out


def test_recorded_upstream_keys_are_what_the_readers_read():
    problems, _ = rehearsal_keys.check()
    assert problems == []


def test_a_drifted_record_fails_the_key_check(monkeypatch):
    data = rehearsal_keys.record()
    data["slime"]["facts"]["loss_key"]["key"] = "train/total_loss"
    data["slime"]["facts"]["train_step_line"]["text"] = 'logger.info(f"iteration {accumulated_step_id} {log_dict}")'
    data["polar"]["facts"]["token_clipping"]["key"] = "clipping"
    monkeypatch.setattr(rehearsal_keys, "record", lambda: data)
    problems, _ = rehearsal_keys.check()
    assert any("train/total_loss" in p for p in problems)
    assert any("training-step line" in p for p in problems)
    assert any("clipped" in p for p in problems)


@pytest.mark.parametrize(
    "fact, text, expected",
    [
        ("logprob_abs_diff_ci_bound", 'assert log_dict["train/train_rollout_logprob_abs_diff"] <= 0.5', "bounds"),
        ("logprob_abs_diff_key", 'reported_loss["rollout_logprob_diff"] = x.clone().detach()', "logs the log-prob"),
        ("pg_loss_is_advantage_times_ratio", "pg_losses1 = -ratio * advantages + entropy", "-ratio x advantage"),
        ("pg_loss_key", '"policy_loss": pg_loss.clone().detach(),', "logs pg_loss"),
    ],
)
def test_a_drifted_record_of_the_tolerances_fails_the_meaning_check(monkeypatch, fact, text, expected):
    """Issue 32 point 7: the log-prob bound, its key and pg_loss's meaning are checked, not only found."""
    data = copy.deepcopy(rehearsal_keys.record())
    data["slime"]["facts"][fact]["text"] = text
    assert not rehearsal_keys.verdict_problems(rehearsal_keys.record()["slime"]["facts"])
    problems = rehearsal_keys.verdict_problems(data["slime"]["facts"])
    assert any(expected in p for p in problems), problems


def test_a_preflight_bound_looser_than_slimes_ci_fails_the_meaning_check():
    facts = rehearsal_keys.record()["slime"]["facts"]
    problems = rehearsal_keys.verdict_problems(facts, {"max_train_rollout_logprob_abs_diff": 0.3})
    assert any("looser than slime's own --ci-test bound 0.1" in p for p in problems)


def test_local_part_judges_what_the_local_runtime_measures():
    good = rehearsal_report.local_part([12, 30], {"targets": [{"outcome": "parsed", "tool_calls": 1}]})
    assert [(v.name, v.verdict) for v in good[:2]] == [("trainable_tokens", "pass"), ("tool_calls", "pass")]
    assert {v.verdict for v in good[2:]} == {"node"} and len(good) == len(rehearsal_report.CLASSES)
    bad = rehearsal_report.local_part([12, 0], {"targets": [{"outcome": "raw_tool_call_text", "tool_calls": 0}]})
    assert [v.verdict for v in bad[:2]] == ["fail", "fail"] and "--tool-call-parser" in bad[1].change
    prose = rehearsal_report.local_part([5], {"targets": [{"outcome": "prose_without_call", "tool_calls": 0}]})
    assert prose[1].verdict == "warn"
    cut = [{"outcome": "cut_at_max_tokens", "tool_calls": 0}]
    unjudged = rehearsal_report.local_part(
        [5], {"targets": cut, "tool_calls": 0, "not_judged": "the script is dropped"}
    )
    assert unjudged[1].verdict == "warn" and unjudged[1].figure == "not judged: the script is dropped"
    assert rehearsal_report.local_part([5], {"targets": [], "tool_calls": 0})[1].verdict == "fail"


def test_local_outcome_names_are_toolchecks():
    from polarstack.checks import tool_exchange

    assert (rehearsal_report.PARSED_OUTCOME, rehearsal_report.RAW_TEXT_OUTCOME) == (
        tool_exchange.PARSED,
        tool_exchange.RAW_TEXT,
    )


def test_a_drifted_record_of_polars_session_marks_and_counters_fails_the_key_check(monkeypatch):
    """Issue 26 points 2 and 4: verify-offline fails when the readers no longer read what the record says Polar's
    adapter and worker, and sglang's refusal, write."""
    data = rehearsal_keys.record()
    data["polar"]["facts"]["session_timeout"]["key"] = "timeout"
    data["polar_worker"]["facts"]["low_complete_fraction"]["key"] = "polar/dropped_low_fraction_groups"
    data["sglang"]["facts"]["context_limit_total"]["key"] = "exceeds the context"
    monkeypatch.setattr(rehearsal_keys, "record", lambda: data)
    problems, _ = rehearsal_keys.check()
    assert any("timed_out" in p for p in problems)
    assert any("polar/dropped_low_fraction_groups" in p for p in problems)
    assert any("exceeds the context" in p for p in problems)
