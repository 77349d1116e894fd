"""Tool calls (issue 10 point 4): the smoke's tool request, the pinned sglang's parser names, and the emulator's parser.

Why: Polar's Anthropic transform builds `tool_use` blocks only from `message.tool_calls`
(../shared/reference/gpu-node.md), and sglang fills `message.tool_calls` only when the engine runs with
`--tool-call-parser` and the request carries tools with tool_choice other than "none"
(sglang/srt/entrypoints/openai/serving_chat.py `_build_chat_response`, ~l.1348-1361 at SGLANG_VERSION). Without it
the agent can never edit a file, every reward is 0 and GRPO learns nothing while training runs.

- `parser_choices()`: the names the pinned `--tool-call-parser` accepts, read with `ast` from the wheel
  (server_args.py: `choices=["auto"] + list(FunctionCallParser.ToolCallParserEnum.keys())`;
  function_call/function_call_parser.py: the `ToolCallParserEnum` dict).
- `exchange_tools(report, http)` / `judge_tool_calls(report)`: the smoke's Polar-shaped request carrying one tool
  schema, sent to every target and judged by Polar's verdict like the other exchanges; then the report fails
  unless `message.tool_calls` came back parsed (outcomes and exit codes: docs/tool-calls.md).
- `parse_qwen25(text, tools)`: the emulator's stand-in for sglang's Qwen25Detector.detect_and_parse
  (function_call/qwen25_detector.py) and the `_process_tool_calls` wrapping (serving_chat.py ~l.1504-1548).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import uuid
import zipfile
from typing import Any

from polarstack.errors import ExitCode, StackError

FLAG = "--tool-call-parser"
PARSER_KNOB = "ENGINE_TOOL_CALL_PARSER"
FUNCTION_CALL_PARSER_PATH = "sglang/srt/function_call/function_call_parser.py"
# Harnesses of Polar's task template that act only through tool calls (tasks.task_template agent.harness).
HARNESSES_NEEDING_TOOL_CALLS = ("claude_code",)
# The tool the smoke offers; the request mirrors what an agent harness sends (OpenAI `tools`).
SMOKE_TOOL = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write text to a file in the task workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
QWEN_BOT, QWEN_EOT = "<tool_call>\n", "\n</tool_call>"  # Qwen25Detector.bot_token / eot_token


def _wheel_text(member: str) -> str:
    from polarstack.cache import cache_dir
    from polarstack.sglang_protocol import _find_wheel, sglang_version, source_dir

    source_dir()  # downloads the pinned wheel once if it is missing
    wheel = _find_wheel(cache_dir() / "wheels", sglang_version())
    if wheel is None:
        raise StackError(
            f"the sglang {sglang_version()} wheel is not in the cache; run `make verify-offline` "
            "once with network access.",
            ExitCode.ENVIRONMENT,
        )
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member).decode("utf-8")


@functools.cache
def parser_enum() -> dict[str, str]:
    """{parser name: detector class name} of FunctionCallParser.ToolCallParserEnum in the pinned wheel."""
    tree = ast.parse(_wheel_text(FUNCTION_CALL_PARSER_PATH))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "FunctionCallParser":
            for item in node.body:
                target = (
                    item.target
                    if isinstance(item, ast.AnnAssign)
                    else (item.targets[0] if isinstance(item, ast.Assign) else None)
                )
                if (
                    isinstance(target, ast.Name)
                    and target.id == "ToolCallParserEnum"
                    and isinstance(item.value, ast.Dict)
                ):
                    return {
                        k.value: v.id
                        for k, v in zip(item.value.keys, item.value.values, strict=False)
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Name)
                    }
    raise StackError(
        f"the pinned sglang's {FUNCTION_CALL_PARSER_PATH} has no ToolCallParserEnum; is the pin right?", ExitCode.USAGE
    )


@functools.cache
def parser_choices() -> tuple[str, ...]:
    """What `--tool-call-parser` accepts at the pin: the extra literal choices of server_args.py plus the enum."""
    from polarstack.sglang_protocol import SERVER_ARGS_PATH, source_dir

    tree = ast.parse((source_dir() / SERVER_ARGS_PATH).read_text(encoding="utf-8"))
    extra: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == FLAG for a in node.args):
            for kw in node.keywords:
                if kw.arg == "choices" and isinstance(kw.value, ast.BinOp) and isinstance(kw.value.left, ast.List):
                    extra = [e.value for e in kw.value.left.elts if isinstance(e, ast.Constant)]
    return tuple(extra) + tuple(parser_enum())


def qwen25_names() -> tuple[str, ...]:
    """Parser names that select Qwen25Detector (the only format the emulator produces)."""
    return tuple(name for name, detector in parser_enum().items() if detector == "Qwen25Detector")


def tool_call_text(tools: list[Any]) -> str:
    """What the emulated model writes when tools are offered: one Qwen-format call of the first tool."""
    first = tools[0]
    function = first.get("function") if isinstance(first, dict) else getattr(first, "function", None)
    name = function.get("name") if isinstance(function, dict) else getattr(function, "name", "tool")
    return f"{QWEN_BOT}{json.dumps({'name': name, 'arguments': {'path': 'solution.py', 'content': 'pass'}})}{QWEN_EOT}"


def parse_qwen25(text: str, tool_names: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """(normal text, OpenAI tool_calls) as Qwen25Detector.detect_and_parse + serving_chat would return them."""
    idx = text.find(QWEN_BOT)
    if idx == -1:
        return text, []
    normal = text[:idx].strip()
    calls = []
    start = idx
    while (begin := text.find(QWEN_BOT, start)) != -1:
        end = text.find(QWEN_EOT, begin + len(QWEN_BOT))
        if end == -1:
            break
        start = end + len(QWEN_EOT)
        try:
            action = json.loads(text[begin + len(QWEN_BOT) : end].strip())
        except ValueError:
            continue  # sglang logs and skips a block that is not JSON
        name = action.get("name") if isinstance(action, dict) else None
        if name not in tool_names:
            continue  # BaseFormatDetector.parse_base_json skips undefined functions by default
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "index": tool_names.index(name),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": json.dumps(
                        action.get("parameters") or action.get("arguments", {}), ensure_ascii=False
                    ),
                },
            }
        )
    return normal, calls


# What an agent harness sends (Polar's Anthropic -> OpenAI transform, src/polar/gateway/transform/anthropic.py,
# `AnthropicTransformer.transform_request` + `_transform_tool_choice_to_openai`, read at 08c6276, the stored
# revision nearest POLAR_COMMIT): whenever the Anthropic body has a non-empty tools list, tool_choice is set,
# defaulting to Anthropic {"type": "auto"} -> OpenAI "auto" (whether the pinned Claude Code CLI sends a tool_choice
# on agent turns is not recorded: configs/upstream/harness-prompt.json does not capture it). "required" would
# also change sglang's decoding (serving_chat.py `_process_messages`: a structure or JSON-schema constraint for
# required/named choices; `_process_tool_calls`' `is_required` branch), so it would not test the agent's path.
TOOL_CHOICE = "auto"
# One write_file call of a small function is well under this (the emulator's is 40 tokens with its tokenizer,
# measured; a real model's was not measured on a GPU); an answer cut here is reported as this setting, not as a
# parser problem.
MAX_TOKENS_ENV = "POLARSTACK_SMOKE_TOOL_MAX_TOKENS"
DEFAULT_MAX_TOKENS = 512
TOOL_PROMPT = (
    "Call the write_file tool exactly once to create solution.py containing a Python function add(a, b) "
    "that returns a + b. Do not answer in prose; only call the tool."
)
# Outcomes of one tool exchange (smoke.Exchange.tool_outcome).
PARSED, RAW_TEXT, CUT, PROSE = "parsed", "raw_tool_call_text", "cut_at_max_tokens", "prose_without_call"


RECORD = "configs/upstream/polar-tool-request.json"


def recorded_fact_problems() -> list[str]:
    """`make verify-offline`: the smoke's tool request acts on the facts recorded from Polar's Anthropic transform
    (RECORD): the harness's tool_choice, and Polar's request flags (contract.prepare_request) on top."""
    from polarstack import contract
    from polarstack.pins import pins, repo_root

    record = json.loads((repo_root() / RECORD).read_text(encoding="utf-8"))
    problems = []
    if record["polar_commit"] != pins()["POLAR_COMMIT"]:
        problems.append(
            f"{RECORD} was read for Polar {record['polar_commit']}, not POLAR_COMMIT="
            f"{pins()['POLAR_COMMIT']}; reread the facts"
        )
    body = tool_request("probe-model", 1)
    expected = record["facts"]["harness_tool_choice"]["tool_choice"]
    if body.get("tool_choice") != expected:
        problems.append(
            f"the smoke's tool request sends tool_choice {body.get('tool_choice')!r}, but Polar's "
            f"transform sends {expected!r} for a harness request that names none or auto, so the smoke "
            "would not test what the agent's requests get"
        )
    lost = [flag for flag in (*contract.POLAR_REQUEST_FLAGS, "logprobs") if body.get(flag) is not True]
    if lost or body.get("stream") is not False:
        problems.append(
            f"the smoke's tool request lacks Polar's request shape ({', '.join(lost) or 'stream false'}),"
            " so a path that drops those fields on tool requests would go unseen"
        )
    return problems


def tool_max_tokens() -> int:
    raw = os.environ.get(MAX_TOKENS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_TOKENS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise StackError(f"{MAX_TOKENS_ENV} must be a positive integer, not {raw!r}.", ExitCode.USAGE)
    return value


def tool_request(model: str, max_tokens: int | None = None) -> dict[str, Any]:
    """Polar's request shape (contract.prepare_request: stream false, logprobs, the two sglang return flags) plus
    one tool schema as a harness sends it, at temperature 0 so a real model's answer is its most likely one."""
    from polarstack import contract

    return contract.prepare_request(
        {
            "model": model,
            "max_tokens": max_tokens or tool_max_tokens(),
            "temperature": 0,
            "tools": [SMOKE_TOOL],
            "tool_choice": TOOL_CHOICE,
            "messages": [{"role": "user", "content": TOOL_PROMPT}],
        }
    )


def classify(parsed: Any) -> tuple[str, int, str | None]:
    """(outcome, number of parsed calls, finish_reason) of a chat completion answering the tool request.
    A cut answer is CUT even when it holds `<tool_call>` text: sglang cannot parse an unterminated block, so the
    parser is not to blame (serving_chat.py hands the detector only the finished text)."""
    choice = parsed["choices"][0] if isinstance(parsed["choices"][0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish = choice.get("finish_reason")
    calls = message.get("tool_calls")
    if (
        isinstance(calls, list)
        and calls
        and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and c["function"].get("name") for c in calls
        )
    ):
        return PARSED, len(calls), finish
    if finish == "length":
        return CUT, 0, finish
    content = message.get("content")
    if isinstance(content, str) and "<tool_call>" in content:
        return RAW_TEXT, 0, finish
    return PROSE, 0, finish


def exchange_tools(report: Any, http: Any) -> None:
    """Send the tool request once to every distinct target of the resolution, each recorded as a smoke exchange
    of kind "tools" (a smoke.Exchange with its tool_outcome) and judged by Polar's pipeline like the others
    (smoke.exchange: orjson parse, decide(), findings); its trainable tokens count in the report. The tool-call
    outcome is judged later (judge_tool_calls), only if the token verdict passed, so a path dropping Polar's
    fields on tool requests fails as it would for any request (exit 3/4/7)."""
    from polarstack.smoke import exchange
    from polarstack.smoke_route import v1_url

    body = {**tool_request(report.model), **(report.tool_fields or {})}  # tool_fields: a scripted real engine
    summary: dict[str, Any] = {
        "targets": [],
        "tool_calls": 0,
        "max_tokens": body["max_tokens"],
        "tool_choice": TOOL_CHOICE,
    }
    report.tool_check = summary
    for target in dict.fromkeys(report.resolution.targets):
        parsed = exchange(report, http, v1_url(target, "chat/completions"), body, "tools", 1)
        entry = report.exchanges[-1]
        entry.tool_outcome, entry.tool_calls, entry.finish_reason = classify(parsed)
        summary["targets"].append(
            {
                "url": entry.url,
                "outcome": entry.tool_outcome,
                "tool_calls": entry.tool_calls,
                "finish_reason": entry.finish_reason,
            }
        )
        summary["tool_calls"] += entry.tool_calls


def judge_tool_calls(report: Any) -> None:
    """Fail the report unless every target answered the tool request with parsed message.tool_calls. Raw
    `<tool_call>` text (the engine runs without the parser) wins over prose, and prose over a cut answer: the
    first is a certain configuration error, the last only an inconclusive check."""
    entries = [e for e in report.exchanges if e.kind == "tools" and e.tool_outcome is not None]
    by_outcome = {
        outcome: next((e for e in entries if e.tool_outcome == outcome), None) for outcome in (RAW_TEXT, PROSE, CUT)
    }
    if (entry := by_outcome[RAW_TEXT]) is not None:
        report.code = ExitCode.TOOL_CALLS
        report.message = (
            f"the tool request to {entry.url} got raw <tool_call> text in message.content "
            f"(finish_reason {entry.finish_reason!r}) instead of parsed message.tool_calls: start "
            f"every engine with {FLAG} (the model family's parser, {PARSER_KNOB} in "
            "configs/stack.env), or the agent can never call a tool and every reward is 0."
        )
    elif (entry := by_outcome[PROSE]) is not None:
        report.code = ExitCode.TOOL_CALLS
        report.message = (
            f"the model behind {entry.url} answered the tool request in prose without calling the "
            f"tool (finish_reason {entry.finish_reason!r}, no <tool_call> text) although the prompt "
            f"asked for write_file at temperature 0; this may be the model, not {FLAG}: serve an "
            f"instruct model of the family {PARSER_KNOB} names, because an agent that never calls a "
            "tool earns reward 0."
        )
    elif (entry := by_outcome[CUT]) is not None:
        # USAGE (bad configuration): the smoke's own budget is too small; the engine and path are not at fault.
        report.code = ExitCode.USAGE
        report.message = (
            f"the answer to the tool request from {entry.url} was cut at max_tokens "
            f"{report.tool_check['max_tokens']} (finish_reason 'length') before the model finished, so "
            f"the smoke cannot tell whether tool calls are parsed; raise {MAX_TOKENS_ENV} and run the "
            "smoke again."
        )
    elif entries:
        report.message += f"; parsed tool_calls from {len(entries)} target(s)"


__all__ = [
    "FLAG",
    "PARSER_KNOB",
    "parser_choices",
    "qwen25_names",
    "parse_qwen25",
    "tool_call_text",
    "exchange_tools",
    "judge_tool_calls",
    "classify",
    "tool_request",
    "recorded_fact_problems",
    "HARNESSES_NEEDING_TOOL_CALLS",
]
