"""Pins the turn cap's budget (issue 34 point 12): the pinned CLI's --max-turns N makes N requests to the engine, each
turn adds the model's output and one tool result, and a Bash result comes back whole up to ~30,000 characters unless
BASH_MAX_OUTPUT_LENGTH is set (measured: configs/upstream/turn-cap.json, scripts/tools/measure_turn_cap.py). So the
plan renders BASH_MAX_OUTPUT_LENGTH in the agent's env, counts context.tool_output_tokens_per_turn in every turn of
the cap, and refuses a budget the measured CLI would break."""

import copy

import pytest
import yaml

from polarstack.checks import budget
from polarstack.paths import load_defaults
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


def _plan(config=None):
    return build_plan(
        "humaneval",
        profiles.load("engine-direct"),
        run_id="t",
        config=config or load_defaults(),
        cluster=load_cluster(),
    )


def test_four_turns_fit_with_their_tool_results():
    config = load_defaults()
    first = budget.harness_record()["agent_turn"]["harness_prompt_tokens"] + 1024 + 2048
    out, tool = budget.request_max_tokens(config), budget.tool_tokens(config)
    assert budget.turn_cap(config) == 4 and (out, tool) == (2048, 2560)
    assert first + 3 * (out + tool) + out <= config["context"]["model_context_length"]
    assert budget.turn_problems(_plan().train_args, config) == []


def test_the_agent_gets_the_bash_output_cut_and_the_cap():
    agent = yaml.safe_load(_plan().files["polar_config.yaml"])["polar_task_template"]["agent"]
    assert agent["env"] == {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2048", "BASH_MAX_OUTPUT_LENGTH": "2000"}
    assert agent["settings"]["max_turns"] == 4


def test_the_record_shows_one_request_per_turn_and_the_cut():
    data = budget.turn_record()
    assert all(run["agent_requests"] == run["max_turns"] for run in data["turns"])
    default = {o["output_chars"]: o["tool_result_chars"] for o in data["bash_outputs"] if not o["agent_env"]}
    cut = [o["tool_result_chars"] for o in data["bash_outputs"] if o["agent_env"]]
    assert default[29000] > 25000 and max(cut) <= budget.tool_tokens(load_defaults())


def test_a_budget_the_measured_cli_breaks_is_refused():
    config = load_defaults()
    args = _plan().train_args
    no_cut = copy.deepcopy(config)
    no_cut["context"]["agent_bash_output_chars"] = 0
    assert any("~30,000 characters" in p for p in budget.turn_problems(args, no_cut))
    small = copy.deepcopy(config)
    small["context"]["tool_output_tokens_per_turn"] = 1000
    assert any("more than context.tool_output_tokens_per_turn=1000" in p for p in budget.turn_problems(args, small))
    short = [a if a != "13824" else "12288" for a in args]
    assert any("--rollout-max-response-len 12288 is below" in p for p in budget.turn_problems(short, config))


def test_a_record_where_a_turn_is_not_one_request_is_a_finding():
    data = copy.deepcopy(budget.turn_record())
    data["turns"][-1]["agent_requests"] += 1
    found = budget.turn_problems(_plan().train_args, load_defaults(), data)
    assert any("is not one request to the engine" in p for p in found)
    data = copy.deepcopy(budget.turn_record())
    for run in data["turns"]:
        run["max_tokens"] = [4096]
    assert any(
        "made the CLI ask max_tokens 2048" in p for p in budget.turn_problems(_plan().train_args, load_defaults(), data)
    )
