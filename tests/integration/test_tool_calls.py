"""Pins issue 10 point 4: engines must return parsed tool calls. The emulator mirrors sglang 0.5.15.post1
(serving_chat.py: parse only with --tool-call-parser, tools in the request and tool_choice != "none"; Qwen25Detector:
`<tool_call>\\n{json}\\n</tool_call>` blocks, finish_reason "tool_calls"); the smoke's tool request fails with exit 12
naming the engine flag unless message.tool_calls comes back parsed; the compose engines and the local runtime run
with the stack's parser; verify-offline refuses engines without a valid parser while the harness needs tool calls."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack import meaning, profiles, toolcheck
from polarstack.cli import main
from polarstack.errors import ExitCode

pytestmark = pytest.mark.emulator


def chat(url: str, **extra) -> dict:
    body = {"model": "Qwen2.5-7B-Instruct", "max_tokens": 64,
            "messages": [{"role": "user", "content": "write add(a, b) to solution.py"}], **extra}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
    reply.raise_for_status()
    return reply.json()["choices"][0]


@pytest.fixture(scope="module")
def engines():
    from polarstack.processes import start_emulator, stop_pid

    with_parser, without = start_emulator(seed=1, tool_call_parser="qwen"), start_emulator(seed=1, tool_call_parser=None)
    yield f"http://127.0.0.1:{with_parser[1]}", f"http://127.0.0.1:{without[1]}"
    for process, _ in (with_parser, without):
        stop_pid(process.pid, process)


def test_parser_and_tools_give_parsed_tool_calls(engines):
    choice = chat(engines[0], tools=[toolcheck.SMOKE_TOOL])
    calls = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == ""
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "write_file" and calls[0]["index"] == 0
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "solution.py", "content": "pass"}


def test_without_parser_the_call_stays_raw_text(engines):
    choice = chat(engines[1], tools=[toolcheck.SMOKE_TOOL])
    assert not choice["message"].get("tool_calls") and choice["finish_reason"] == "stop"
    assert choice["message"]["content"].startswith("<tool_call>\n{") and "</tool_call>" in choice["message"]["content"]


def test_tool_choice_none_and_no_tools_are_not_parsed(engines):
    choice = chat(engines[0], tools=[toolcheck.SMOKE_TOOL], tool_choice="none")
    assert not choice["message"].get("tool_calls") and "<tool_call>" in choice["message"]["content"]
    plain = chat(engines[0])
    assert not plain["message"].get("tool_calls") and "<tool_call>" not in plain["message"]["content"]


def test_smoke_fails_with_exit_12_naming_the_flag(engines, capsys):
    assert main(["smoke", "--base-url", engines[1], "--json"]) == ExitCode.TOOL_CALLS == 12
    out, err = capsys.readouterr()
    assert json.loads(out)["code"] == "TOOL_CALLS"
    assert "--tool-call-parser" in err and "raw <tool_call> text" in err and len(err.strip().splitlines()) == 1
    assert main(["smoke", "--base-url", engines[0], "--json"]) == 0


def test_emulator_refuses_unknown_or_unemulated_parsers(capsys):
    assert main(["emulate-engine", "--port", "1", "--tool-call-parser", "nonsense"]) == ExitCode.USAGE
    assert "not a parser of the pinned sglang" in capsys.readouterr().err
    assert main(["emulate-engine", "--port", "1", "--tool-call-parser", "llama3"]) == ExitCode.USAGE
    assert "Qwen format" in capsys.readouterr().err


def test_parser_choices_come_from_the_pinned_wheel():
    choices = toolcheck.parser_choices()
    assert choices[0] == "auto" and {"qwen", "qwen25", "llama3", "hermes"} <= set(choices)
    assert set(toolcheck.qwen25_names()) == {"qwen", "qwen25"}


def test_verify_offline_meaning_refuses_engines_without_a_parser():
    assert meaning.tool_parser_problems({"engine-0": ["--port", "1", "--tool-call-parser", "qwen"]}, "claude_code") == []
    missing = meaning.tool_parser_problems({"engine-0": ["--port", "1"]}, "claude_code")
    assert missing and "engine-0 runs without --tool-call-parser" in missing[0]
    wrong = meaning.tool_parser_problems({"engine-0": ["--tool-call-parser=qwen9"]}, "claude_code")
    assert wrong and "qwen9 is not a parser of the pinned sglang" in wrong[0]


def test_local_runtime_and_compose_start_engines_with_the_stack_parser():
    from polarstack import compose

    profile = profiles.load("engine-direct")
    assert profiles.knob(profile, toolcheck.PARSER_KNOB) == "qwen"
    assert compose.render_values(profile)[toolcheck.PARSER_KNOB] == "qwen"
    text = (compose.compose_file()).read_text()
    assert text.count("- --tool-call-parser\n      - ${ENGINE_TOOL_CALL_PARSER:?") == 2


@pytest.mark.router
def test_verify_offline_fails_for_a_bad_parser(monkeypatch, capsys):
    monkeypatch.setenv(toolcheck.PARSER_KNOB, "qwen9")
    assert main(["verify-offline", "--skip-downloads", "--json"]) == ExitCode.USAGE
    problems = [p for c in json.loads(capsys.readouterr().out)["checks"] for p in c["problems"]]
    assert any("--tool-call-parser qwen9 is not a parser of the pinned sglang" in p for p in problems), problems


@pytest.mark.router
def test_verify_offline_fails_when_the_parser_is_unset(monkeypatch, capsys):
    monkeypatch.setenv(toolcheck.PARSER_KNOB, "")
    assert main(["verify-offline", "--skip-downloads", "--json"]) == ExitCode.USAGE
    problems = [p for c in json.loads(capsys.readouterr().out)["checks"] for p in c["problems"]]
    assert any(toolcheck.PARSER_KNOB in p for p in problems), problems


def test_local_runtime_without_parser_fails_the_smoke_with_12(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv(toolcheck.PARSER_KNOB, "")
    assert main(["up", "--profile", "engine-direct"]) == 0
    try:
        capsys.readouterr()
        assert main(["smoke", "--json"]) == ExitCode.TOOL_CALLS
        assert "--tool-call-parser" in capsys.readouterr().err
    finally:
        assert main(["down"]) == 0
