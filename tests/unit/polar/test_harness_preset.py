"""Pins the per-session turn cap (issue 26 point 4): chosen from the budget so that a session's last request still
fits the engine context when every turn writes the per-request max_tokens (sglang refuses input + max_tokens beyond
the context), rendered as Polar's claude_code preset setting max_turns, which its run_steps turns into the CLI's
--max-turns (recorded in configs/upstream/polar-harness-presets.json, with the flag found in the pinned CLI), shown
by the dry run, and checked by verify-offline."""

import copy

import pytest
import yaml

from polarstack.checks import budget
from polarstack.offline.verify import check_harness_preset
from polarstack.paths import load_defaults
from polarstack.polar import harness_preset
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train import preflight
from polarstack.train.plan import build_plan

pytestmark = pytest.mark.unit


def _agent(plan):
    return yaml.safe_load(plan.files["polar_config.yaml"])["polar_task_template"]["agent"]


def test_the_cap_is_the_most_turns_whose_last_request_fits_the_context():
    config = load_defaults()
    record = budget.harness_record()
    first = (
        record["agent_turn"]["harness_prompt_tokens"]
        + config["context"]["harness_margin_tokens"]
        + config["grpo"]["rollout_max_prompt_len"]
    )
    cap, per_request = budget.turn_cap(config), budget.request_max_tokens(config)
    tool = budget.tool_tokens(config)  # each turn's tool result counted too (issue 34 point 12)
    assert cap == 4  # 1 + (32,768 - (11,563 + 1,024 + 2,048) - 2,048) // (2,048 + 2,560)
    context = config["context"]["model_context_length"]
    step = per_request + tool
    assert first + (cap - 1) * step + per_request <= context < first + cap * step + per_request
    smaller = copy.deepcopy(config)
    smaller["context"]["tool_output_tokens_per_turn"] = 0
    assert budget.turn_cap(smaller) == 8  # the cap moves with the budget: model output alone, 2,048 a turn
    smaller["context"]["agent_max_output_tokens"] = 4096
    assert budget.turn_cap(smaller) == 4  # the count before issue 34: tool results were not counted


@pytest.mark.parametrize("name", ["engine-direct", "patched-router"])
def test_the_plan_and_the_rehearsal_cap_every_session(name):
    profile = profiles.load(name)
    plan = build_plan("humaneval", profile, run_id="x", cluster=load_cluster())
    assert _agent(plan)["settings"]["max_turns"] == budget.turn_cap(load_defaults())
    assert any("at most 4 turns each" in line and "--max-turns" in line for line in plan.as_dict()["watch"])
    rehearsal = preflight.build(profile, run_id="preflight-x", cluster=load_cluster())
    assert all(_agent(p)["settings"]["max_turns"] == 4 for _, p in rehearsal.phases)


def test_the_preset_records_the_setting_and_the_cli_its_flag():
    facts = harness_preset.record()["presets"]["claude_code"]
    assert facts["settings_flags"]["max_turns"] == "--max-turns"
    assert "--max-turns" in facts["max_turns_in_cli"]["text"]
    assert harness_preset.turn_cap_settings("claude_code", 4) == {"max_turns": 4}
    assert harness_preset.turn_cap_settings("codex", 4) == {}  # nothing recorded for codex: no setting invented


def test_verify_offline_fails_a_template_without_the_cap_or_a_record_without_the_flag():
    agent = _agent(build_plan("humaneval", profiles.load("engine-direct"), run_id="x", cluster=load_cluster()))
    assert harness_preset.turn_cap_problems(agent, 4) == []
    assert check_harness_preset(load_cluster()).ok
    uncapped = {**agent, "settings": {}}
    assert "max_turns=None, not 4 turns" in harness_preset.turn_cap_problems(uncapped, 4)[0]
    facts = copy.deepcopy(harness_preset.record())
    facts["presets"]["claude_code"]["max_turns_in_cli"]["cli_version"] = "2.0.0"
    assert "taking --max-turns" in harness_preset.turn_cap_problems(agent, 4, facts)[0]
    del facts["presets"]["claude_code"]["settings_flags"]
    assert "records no setting" in harness_preset.turn_cap_problems(agent, 4, facts)[0]
