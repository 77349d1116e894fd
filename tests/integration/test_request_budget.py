"""Issue 18 point 2: every agent request must fit the engine's context (sglang's total-token check).

The pinned CLI asks max_tokens 32000 by default on an ~11.6k-token harness prompt; sglang 0.5.15.post1 refuses
input + max_new_tokens > context (tokenizer_manager.py `_validate_one_request`). The stack caps the agent's
requests (context.agent_max_output_tokens -> CLAUDE_CODE_MAX_OUTPUT_TOKENS), the emulator applies sglang's check
with sglang's message, and the smoke's tool exchange has the agent's first-turn shape, so a configuration the node
would refuse fails `make smoke` in one sentence naming the setting."""

import dataclasses

import httpx
import pytest
import yaml

from polarstack.checks import budget, tool_exchange
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.cli.main import main
from polarstack.engine.emulator import tokenizer_manager as context_check
from polarstack.engine.emulator.engine import CONTEXT_LENGTH
from polarstack.engine.tool_parser import wheel_text
from polarstack.errors import ExitCode
from polarstack.paths import load_defaults, train_defaults
from polarstack.stack import profiles
from polarstack.stack.cluster import load as load_cluster
from polarstack.train.plan import build_plan

ONE = SmokeOptions(requests=1, turns=0)  # one plain request, then the tool requests
pytestmark = pytest.mark.emulator


@pytest.fixture(autouse=True)
def no_state(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))


@pytest.fixture
def uncapped_defaults(tmp_path, monkeypatch):
    """configs/train/defaults.yaml as it was before the cap: the CLI's own max_tokens on every request."""
    config = yaml.safe_load(train_defaults().read_text())
    config["context"]["agent_max_output_tokens"] = 0
    path = tmp_path / "defaults.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr(budget, "train_defaults", lambda: path)


def chat(url, **body):
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_the_emulator_refuses_input_plus_max_tokens_beyond_the_context_with_sglangs_message(engine):
    reply = chat(engine.url, max_tokens=CONTEXT_LENGTH - 5)
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "BadRequestError" and body["code"] == 400
    assert body["message"].startswith(
        f"Requested token count exceeds the model's maximum context length of {CONTEXT_LENGTH} tokens. "
        "You requested a total of "
    )
    assert chat(engine.url, max_tokens=16).status_code == 200  # a request that fits is answered


def test_the_emulators_check_is_the_pinned_sglangs():
    source = wheel_text(context_check.TOKENIZER_MANAGER)
    assert context_check.upstream_problems(source) == []
    assert context_check.upstream_problems(source.replace("> _max_req_len", ">= _max_req_len"))


def test_the_cli_reads_its_output_cap_from_the_environment_and_asks_it():
    record = budget.harness_record()
    cited = record["agent_env_read_by_cli"][budget.AGENT_OUTPUT_ENV]
    assert f"process.env.{budget.AGENT_OUTPUT_ENV}" in cited["statement"]
    assert record["agent_env"] == {budget.AGENT_OUTPUT_ENV: "4096"} and record["max_tokens_requested"] == 4096
    assert record["max_tokens_without_agent_env"] == 32000


@pytest.mark.parametrize("name", ("engine-direct", "router-passthrough", "patched-router"))
def test_every_working_profile_caps_the_agent_and_its_last_request_fits(name):
    config = load_defaults()
    plan = build_plan("humaneval", profiles.load(name), run_id="t", config=config, cluster=load_cluster())
    agent = yaml.safe_load(plan.files["polar_config.yaml"])["polar_task_template"]["agent"]
    # the output cap and the Bash result cut the pinned CLI reads (configs/upstream/turn-cap.json)
    assert agent["env"] == {
        budget.AGENT_OUTPUT_ENV: str(config["context"]["agent_max_output_tokens"]),
        budget.BASH_OUTPUT_ENV: str(config["context"]["agent_bash_output_chars"]),
    }
    assert budget.request_problems(plan.train_args, config) == []


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["context.agent_max_output_tokens=0"], "per-request max_tokens 32000"),  # the CLI's default
        (["grpo.rollout_max_response_len=16384"], "per-request max_tokens 2048 = 33067 tokens exceed"),
    ],
)
def test_the_plan_refuses_a_budget_whose_last_request_the_engine_would_refuse(capsys, sets, needle):
    argv = ["train", "--task", "humaneval", "--dry-run"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert needle in err and "context.agent_max_output_tokens" in err and len(err.splitlines()) == 1


def test_smoke_passes_with_the_cap_and_sends_the_agents_first_turn_shape(engine):
    engine.clear()
    report = run_smoke(SmokeTarget(engine.url), ONE)
    assert report.ok, report.message
    pad, max_tokens = budget.harness_request_shape()
    assert report.tool_check["max_tokens"] == max_tokens and report.tool_check["prompt_padding_tokens"] == pad
    short, long = [e for e in report.exchanges if e.kind == "tools"]
    assert not short.padded and long.padded
    assert len(long.prompt_ids) > pad > len(short.prompt_ids)  # the harness-length prompt reached the engine


def test_smoke_fails_in_one_sentence_naming_the_setting_when_the_agents_requests_exceed_the_context(
    engine, uncapped_defaults
):
    report = run_smoke(SmokeTarget(engine.url), ONE)
    assert report.code == ExitCode.USAGE, report.message
    assert "context.agent_max_output_tokens" in report.message and budget.AGENT_OUTPUT_ENV in report.message
    assert "max_tokens 32000" in report.message and report.message.count(". ") == 0
    assert report.tool_check["max_tokens"] == 32000
    assert tool_exchange.tool_max_tokens() == 32000


def test_the_padding_can_be_switched_off(engine):
    knobs = tool_exchange.knobs_from({tool_exchange.PAD_ENV: "0"})  # as the CLI reads them from its environment
    report = run_smoke(SmokeTarget(engine.url), dataclasses.replace(ONE, knobs=knobs))
    assert report.ok, report.message
    assert report.tool_check["prompt_padding_tokens"] == 0


def test_the_gate_sends_the_plans_own_cap(engine, capsys):
    """make train's gate and the in-job gate pass the rendered agent.env: the tool request asks that cap, and a
    plan without one (the CLI's 32000) fails the smoke in one sentence naming the setting."""
    capped = run_smoke(SmokeTarget(engine.url, agent_env={budget.AGENT_OUTPUT_ENV: "2048"}), ONE)
    assert capped.ok and capped.tool_check["max_tokens"] == 2048, capped.message
    uncapped = run_smoke(SmokeTarget(engine.url, agent_env={}), ONE)
    assert uncapped.code == ExitCode.USAGE and "max_tokens 32000" in uncapped.message


def test_the_in_job_gate_reads_the_cap_from_the_jobs_task_template():
    from types import SimpleNamespace

    from polarstack.train import gate

    config = yaml.safe_load(
        build_plan("humaneval", profiles.load("engine-direct"), run_id="t", cluster=load_cluster()).files[
            "polar_config.yaml"
        ]
    )
    env = gate.agent_env_of(SimpleNamespace(**config))
    cap = load_defaults()["context"]["agent_max_output_tokens"]
    assert env == budget.agent_env(load_defaults()) and env[budget.AGENT_OUTPUT_ENV] == str(cap) == "2048"
    assert budget.env_max_tokens(env) == 2048
    assert gate.agent_env_of(SimpleNamespace()) is None  # no task template: the smoke uses the defaults
