"""Pins `polarstack tasks prepare`: slime prompt data with the launch flags' keys, agent workspaces without the
tests, hidden tests for the evaluator, Polar's task template; clear errors for bad or unavailable task data."""

import json
import sys
from pathlib import Path

import pytest
import yaml

from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.reward import tasks

pytestmark = pytest.mark.unit
FIXTURE = Path(__file__).parents[2] / "fixtures" / "mbpp_sample.jsonl"


def test_humaneval_prepare(tmp_path, capsys):
    assert main(["tasks", "prepare", "humaneval", "--out", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == 164
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 164 and set(rows[0]) == {"prompt", "label", "metadata"}
    assert rows[0]["prompt"][0]["role"] == "user" and "has_close_elements" in rows[0]["prompt"][0]["content"]
    workspace = tmp_path / "workspaces" / rows[0]["metadata"]["workspace"]
    assert sorted(p.name for p in workspace.iterdir()) == ["solution.py"]
    assert "check(" not in (workspace / "solution.py").read_text()  # the tests stay hidden from the agent
    assert (tmp_path / "eval" / rows[0]["metadata"]["workspace"] / "problem.json").exists()
    config = yaml.safe_load((tmp_path / "polar_config.yaml").read_text())
    template = config["polar_task_template"]
    assert template["runtime"]["backend"] == "apptainer"
    assert template["builder"]["strategy"] == "prefix_merging"
    assert template["evaluator"]["strategy"] == "test_on_output"
    assert config["dynamic_history"] is True


def test_mbpp_from_a_file_in_mbpps_schema(tmp_path):
    result = tasks.prepare("mbpp", tmp_path, source=FIXTURE)
    assert result["problems"] == 3
    row = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert "larger" in row["prompt"][0]["content"] and row["metadata"]["problem"]["kind"] == "mbpp"


def test_mbpp_without_datasets_names_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ModuleNotFoundError
    assert main(["tasks", "prepare", "mbpp", "--out", str(tmp_path)]) == ExitCode.ENVIRONMENT
    err = capsys.readouterr().err
    assert "--source" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"task_id": 1, "text": "x", "code": "def f(): pass"}\n', "lacks test_list"),
        ("not json\n", "is not JSON"),
        ('{"task_id": 1, "text": "x", "code": "c", "test_list": ["assert 1"]}\n' * 2, "appears twice"),
        ("", "holds no problems"),
    ],
)
def test_bad_task_data_is_refused(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    assert (
        main(["tasks", "prepare", "mbpp", "--out", str(tmp_path / "out"), "--source", str(bad)]) == ExitCode.TASK_DATA
    )
    assert needle in capsys.readouterr().err


def test_unknown_task(tmp_path, capsys):
    assert main(["tasks", "prepare", "nope", "--out", str(tmp_path)]) == ExitCode.USAGE


def test_polar_keeps_every_session_of_a_group():
    """Node-path review of issues 18/19: Polar cancels a group's slowest sessions once
    min(n, ceil(n * min_complete_accept_fraction) + early_stop_grace_sessions) are usable; the grace keeps all n."""
    import math

    from polarstack.paths import load_defaults

    config = tasks.polar_config("humaneval", "/tasks")
    n = load_defaults()["grpo"]["n_samples_per_prompt"]
    usable = min(
        n, math.ceil(n * config["polar_min_complete_accept_fraction"]) + config["polar_early_stop_grace_sessions"]
    )
    assert usable == n


def test_polar_config_defaults_to_the_plans_polar_ports():
    """`polarstack tasks prepare` alone renders the ports configs/train/defaults.yaml gives Polar (issue 34 point 5)."""
    from polarstack.paths import load_defaults

    polar = load_defaults()["polar"]
    config = tasks.polar_config("humaneval", "/tasks")
    assert config["polar_rollout_url"] == f"http://127.0.0.1:{polar['rollout_port']}"
    assert config["polar_gateway_url"] == f"http://127.0.0.1:{polar['gateway_port']}"
