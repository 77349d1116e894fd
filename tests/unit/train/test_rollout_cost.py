"""Issue 18 point 7: `make train` prints an estimate of traces and tokens per rollout from the plan."""

import json

import pytest

from polarstack.checks import budget
from polarstack.cli.main import main
from polarstack.paths import load_defaults
from polarstack.train import rollout_cost

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def test_the_dry_run_prints_traces_and_tokens_per_rollout(capsys):
    assert main(["train", "--task", "humaneval", "--dry-run"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "cost per rollout" in x)
    harness = budget.harness_record()["agent_turn"]["harness_prompt_tokens"]
    assert "48 agent trajectories -> at least 48 traces" in line
    cap = harness + 1024 + 2048 + 13824  # margin + task prompt + response of configs/train/defaults.yaml
    assert f"each {harness:,}-{cap:,} tokens: {48 * harness:,}-{48 * cap:,} tokens at one trace per trajectory" in line


def test_the_estimate_follows_the_plan(capsys):
    assert main(["train", "--task", "humaneval", "--dry-run", "--json", "--set", "grpo.rollout_batch_size=12"]) == 0
    cost = json.loads(capsys.readouterr().out)["cost_per_rollout"]
    assert cost["trajectories"] == 96 and cost["min_tokens"] == 96 * cost["min_tokens_per_trace"]
    assert cost["max_tokens_per_trace"] <= load_defaults()["context"]["seq_length"]


def test_a_trace_is_capped_at_seq_length():
    config = load_defaults(["context.seq_length=20000"])
    assert rollout_cost.estimate(config, 11563).max_tokens_per_trace == 20000
