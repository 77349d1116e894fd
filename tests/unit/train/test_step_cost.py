"""Issue 26 point 8: the dry run prints what a step costs next to the token range: memory from the memory model, and
time computed from the throughput assumptions of configs/train/defaults.yaml (`cost:`), labelled as computed."""

import json

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode

pytestmark = pytest.mark.unit
P7 = 7_615_616_512


@pytest.fixture(autouse=True)
def no_node(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("GPU_MEMORY_GB", raising=False)


def plan(capsys, *sets):
    assert main(["train", "--task", "humaneval", "--dry-run", "--json", *[f"--set={s}" for s in sets]]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_step_cost_is_printed_next_to_the_token_range(capsys):
    assert main(["train", "--task", "humaneval", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if "cost per rollout" in x)
    step = lines[at + 1]
    assert "cost per step (computed from stated assumptions, not measured" in step
    assert (
        "memory 117.7 GB per trainer GPU of 140.0 (optimizer offload on), host 253.2 GB" in step
    )  # + 8 GB object store
    assert "150 TFLOPS per trainer GPU x 3" in step and "1500 output tokens/s per engine x 1" in step


def test_the_time_is_computed_from_the_tokens_and_the_assumptions(capsys):
    data = plan(capsys)
    cost, tokens = data["cost_per_step"], data["cost_per_rollout"]
    s = tokens["min_tokens_per_trace"]
    flops = 6 * (2 * P7 * s + 2 * 28 * 3584 * s**2) * tokens["trajectories"]
    assert cost["min_train_seconds"] == pytest.approx(flops / (3 * 150e12), abs=0.1)
    assert cost["max_generation_seconds"] == pytest.approx(48 * 13824 / 1500, abs=0.1)
    assert cost["computed_not_measured"] is True
    faster = plan(capsys, "cost.trainer_tflops_per_gpu=300")["cost_per_step"]
    assert faster["max_train_seconds"] == pytest.approx(cost["max_train_seconds"] / 2, rel=1e-3)
    more = plan(capsys, "grpo.rollout_batch_size=12")["cost_per_step"]
    assert more["min_train_seconds"] == pytest.approx(2 * cost["min_train_seconds"], rel=1e-3)


def test_a_missing_assumption_is_a_usage_error(capsys):
    assert (
        main(["train", "--task", "humaneval", "--dry-run", "--set", "cost.trainer_tflops_per_gpu=0"]) == ExitCode.USAGE
    )
    assert "cost.trainer_tflops_per_gpu=0 must be a positive number" in capsys.readouterr().err
