"""Pins the task prompt budget (issue 34 point 8): slime's --rollout-max-prompt-len filters no message-list prompt (its
filter_long_prompt skips them), so `tasks prepare`, `make train` and `make preflight` refuse a problem whose instruction
may exceed grpo.rollout_max_prompt_len, by the token bound NFC UTF-8 bytes (Qwen's tokenizer is byte-level BPE:
configs/upstream/prompt-budget.json, recorded by scripts/tools/record_prompt_budget.py); verify-offline checks what the
record means and that the shipped data passes."""

import copy
import json

import pytest

from polarstack.cli.main import main
from polarstack.errors import ExitCode, StackError
from polarstack.offline import prompt_budget
from polarstack.paths import load_defaults
from polarstack.reward import tasks
from polarstack.stack.resolved import read_now

pytestmark = pytest.mark.unit


def long_mbpp(tmp_path, chars: int):
    row = {"task_id": 1, "text": "x" * chars, "code": "def f(a):\n    return a\n", "test_list": ["assert f(1) == 1"]}
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_an_instruction_over_the_budget_is_refused(tmp_path, capsys):
    source = long_mbpp(tmp_path, 3000)
    code = main(["tasks", "prepare", "mbpp", "--out", str(tmp_path / "out"), "--source", str(source)])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.TASK_DATA and len(err.splitlines()) == 1
    assert "mbpp problem 1: its instruction is" in err and "above grpo.rollout_max_prompt_len=2048" in err
    assert not (tmp_path / "out" / "train.jsonl").exists()


def test_an_instruction_within_the_budget_passes(tmp_path):
    result = tasks.prepare("mbpp", tmp_path / "out", source=long_mbpp(tmp_path, 1500), max_prompt_tokens=2048)
    assert result["problems"] == 1


def test_the_bound_counts_nfc_bytes():
    assert tasks.prompt_token_bound("abc") == 3
    assert tasks.prompt_token_bound("e\u0301") == 2  # NFC composes it to é, 2 bytes
    assert tasks.prompt_token_bound("日本") == 6


def test_make_train_passes_the_plans_budget_to_prepare(monkeypatch):
    """launch.py prepares the tasks with grpo.rollout_max_prompt_len before launch.sh runs."""
    from polarstack.train import launch

    seen = {}

    def prepare(*args, **kwargs):
        seen.update(kwargs)
        raise StackError("stop here", ExitCode.TASK_DATA)

    monkeypatch.setattr(launch.tasks, "prepare", prepare)
    for name in ("shape_probe", "sandbox_probe"):
        monkeypatch.setattr(
            getattr(launch, name), "check_docker" if name == "shape_probe" else "check_in_trainer", lambda *a, **k: None
        )
    monkeypatch.setattr(launch, "check_checkpoint_space", lambda *a, **k: None)

    class Plan:
        run_id, memory, files = "t", None, {}
        config = copy.deepcopy(load_defaults())

    Plan.config["grpo"]["rollout_max_prompt_len"] = 777

    class Request:
        task, source, resume = "humaneval", None, False

    with pytest.raises(StackError):
        launch.launch_in_trainer(Request(), Plan(), None, read_now())
    assert seen["max_prompt_tokens"] == 777


def test_the_shipped_humaneval_fits_and_the_record_means_what_the_check_assumes():
    assert prompt_budget.record_problems() == []
    assert prompt_budget.plan_problems(["--rollout-max-prompt-len", "2048"], "t") == []
    found = prompt_budget.plan_problems(["--rollout-max-prompt-len", "1000"], "t")
    assert found and "HumanEval/" in found[0]
    assert prompt_budget.plan_problems(["--rollout-max-prompt-len", "2048", "--apply-chat-template"], "t")


def test_record_problems_catch_a_filter_that_now_applies_or_a_bound_that_fails():
    data = prompt_budget.record()
    broken = copy.deepcopy(data)
    broken["slime"]["list_prompt_skipped"]["text"] = "pass"
    assert any("list_prompt_skipped" in p for p in prompt_budget.record_problems(broken))
    broken = copy.deepcopy(data)
    broken["tokenizer"]["byte_fallback"] = True
    assert any("byte fallback" in p for p in prompt_budget.record_problems(broken))
    broken = copy.deepcopy(data)
    broken["other_scripts"][0]["tokens"] = 99
    assert any("more tokens than NFC bytes" in p for p in prompt_budget.record_problems(broken))
