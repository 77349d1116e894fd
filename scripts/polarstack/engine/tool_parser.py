"""Tool calls (issue 10 point 4): the pinned sglang's parser names, and the emulator's parser.

Why: Polar's Anthropic transform builds `tool_use` blocks only from `message.tool_calls`
(../shared/reference/gpu-node.md), and sglang fills `message.tool_calls` only when the engine runs with
`--tool-call-parser` and the request carries tools with tool_choice other than "none"
(sglang/srt/entrypoints/openai/serving_chat.py `_build_chat_response`, ~l.1348-1361 at SGLANG_VERSION). Without it
the agent can never edit a file, every reward is 0 and GRPO learns nothing while training runs.

- `parser_choices()`: the names the pinned `--tool-call-parser` accepts, read with `ast` from the wheel
  (server_args.py: `choices=["auto"] + list(FunctionCallParser.ToolCallParserEnum.keys())`;
  function_call/function_call_parser.py: the `ToolCallParserEnum` dict).
- The smoke's tool request and its judgement: polarstack.checks.tool_exchange.
- `parse_qwen25(text, tools)`: the emulator's stand-in for sglang's Qwen25Detector.detect_and_parse
  (function_call/qwen25_detector.py) and the `_process_tool_calls` wrapping (serving_chat.py ~l.1504-1548).
"""

from __future__ import annotations

import ast
import functools
import json
import uuid
import zipfile
from typing import Any

from polarstack.engine import agent_turn
from polarstack.engine.protocol import SERVER_ARGS_PATH, find_wheel, sglang_version, source_dir
from polarstack.errors import ExitCode, StackError
from polarstack.paths import cache_dir

FLAG = "--tool-call-parser"
PARSER_KNOB = "ENGINE_TOOL_CALL_PARSER"
FUNCTION_CALL_PARSER_PATH = "sglang/srt/function_call/function_call_parser.py"
# Harnesses of Polar's task template that act only through tool calls (tasks.task_template agent.harness).
HARNESSES_NEEDING_TOOL_CALLS = ("claude_code",)
# The tool the smoke offers (checks.tool_exchange) and the real engine's scripted answer calls (stack.local); the request mirrors what an agent harness sends (OpenAI `tools`).
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


def wheel_text(member: str) -> str:
    source_dir()  # downloads the pinned wheel once if it is missing
    wheel = find_wheel(cache_dir() / "wheels", sglang_version())
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
    tree = ast.parse(wheel_text(FUNCTION_CALL_PARSER_PATH))
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


def _function(tool: Any) -> Any:
    return tool.get("function") if isinstance(tool, dict) else getattr(tool, "function", None)


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def tool_call_text(tools: list[Any]) -> str:
    """What the emulated model writes when tools are offered (and the real engine's scripted answer, stack.local):
    one Qwen-format call of the first tool that takes a `content` (the smoke asks for the file write among the
    agent's tools, engine.agent_turn), else of the first tool; its required text arguments filled in."""
    functions = [_function(t) for t in tools]
    writes = [f for f in functions if "content" in (_field(_field(f, "parameters"), "properties") or {})]
    function = (writes or functions)[0]
    name = _field(function, "name") or "tool"
    properties = _field(_field(function, "parameters"), "properties") or {}
    required = _field(_field(function, "parameters"), "required") or list(properties)
    arguments = {key: "solution.py" if key.endswith("path") else "pass" for key in required} or {
        "path": "solution.py",
        "content": "pass",
    }
    return f"{QWEN_BOT}{json.dumps({'name': name, 'arguments': arguments})}{QWEN_EOT}"


def smoke_call_text() -> str:
    """The call the smoke's tool request asks for, in Qwen format: the write tool of the agent's tools
    (engine.agent_turn), what the local real engine's scripted answer writes (stack.local, stack.device)."""
    return tool_call_text(agent_turn.tools(False))


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
