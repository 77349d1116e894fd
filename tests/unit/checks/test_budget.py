"""Pins the token budget of one agent trace (issue 10, point 5): the launch passes --seq-length (slime's default
4096 is below the measured prompt of the pinned agent CLI alone, configs/upstream/harness-prompt.json), with
activation recompute, and `make train` / `make verify-offline` refuse a configuration where harness prompt +
task prompt + response > seq_length, seq_length > max_tokens_per_gpu x CP, or seq_length > the model's context."""

import pytest

from polarstack.checks import budget
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.offline.verify import check_sequence_budget
from polarstack.paths import load_defaults
from polarstack.pins import pins
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def test_measured_harness_prompt_is_for_the_pinned_cli_and_exceeds_slimes_default():
    record = budget.harness_record()
    assert record["agent_cli"] == {"package": pins()["AGENT_CLI_PACKAGE"], "version": pins()["AGENT_CLI_VERSION"]}
    turn = record["agent_turn"]
    assert turn["tool_count"] == len(turn["tool_names"]) > 0
    assert turn["harness_prompt_tokens"] == (
        turn["system"]["tokens"]
        + turn["tools"]["tokens"]
        + turn["first_messages"]["tokens"]
        - turn["task_text_in_messages"]["tokens"]
    )
    assert turn["harness_prompt_tokens"] > 4096  # why slime's default --seq-length cannot work


@pytest.mark.parametrize("name", profiles.PROFILE_ORDER)
def test_launch_passes_seq_length_and_recompute(name):
    args = build_plan("humaneval", profiles.load(name), run_id="t", cluster=load_cluster()).train_args
    config = load_defaults()
    assert budget.flag_value(args, "--seq-length") == config["context"]["seq_length"]
    assert " ".join(config["context"]["recompute"]) in " ".join(args)
    assert budget.check(args, config) == []


def test_without_seq_length_the_check_names_slimes_default():
    args = build_plan("humaneval", profiles.load("engine-direct"), run_id="t", cluster=load_cluster()).train_args
    i = args.index("--seq-length")
    problems = budget.check(args[:i] + args[i + 2 :], load_defaults())
    assert problems and "slime uses 4096 tokens" in problems[0]


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["context.seq_length=16384"], "exceed --seq-length 16384"),
        (["grpo.max_tokens_per_gpu=16384"], "exceeds --max-tokens-per-gpu 16384 x context-parallel size 1"),
        (["context.seq_length=65536", "grpo.max_tokens_per_gpu=65536"], "exceeds the model's context length 32768"),
    ],
)
def test_train_refuses_a_budget_that_clips_every_trace(capsys, sets, needle):
    argv = ["train", "--task", "humaneval", "--dry-run"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_verify_offline_checks_the_budget_per_profile():
    check = check_sequence_budget(profiles.load("patched-router"), load_cluster())
    assert check.ok, check.problems
    assert "harness" in check.detail and "seq 32768" in check.detail


def test_a_stale_measurement_is_refused(monkeypatch):
    record = budget.harness_record()
    record["agent_cli"]["version"] = "0.0.1"
    monkeypatch.setattr(budget, "harness_record", lambda: record)
    problems = budget.check(["--seq-length", "32768", "--max-tokens-per-gpu", "32768"], load_defaults())
    assert problems and "measure_harness_prompt.py" in problems[0]
