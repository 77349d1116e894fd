"""The smoke's tool request shaped like the agent's first turn (issue 32 point 6), in the project's own words.

What it relies on (configs/upstream/harness-prompt.json, scripts/tools/measure_harness_prompt.py, captured from the
pinned CLI against a local stand-in of the Messages API):
- the 12 tool names in the CLI's order, and each tool's parameter shape (`agent_turn.tool_shapes`: property names,
  JSON types, required lists, item shapes, how many enum values; never the CLI's descriptions);
- each tool's description length in tokens (`description_tokens`), the system prompt's length (`system.tokens`) and
  the first user message's (`first_messages.tokens`, the CLI's wrapping of the task);
- that the CLI sends no tool_choice (`agent_turn.tool_choice` null), so Polar's transform sets "auto".

What is the project's: every description and the system prompt are ordinary prose written here (the CLI's own text
is not ours to commit), built to the recorded lengths with `estimate_tokens`, a count of words and punctuation marks
(common English words are one Qwen BPE token each with their leading space). The record's `smoke_request` holds
what the Qwen tokenizer counts for the request built here (scripts/tools/measure_harness_prompt.py
--smoke-request), and `shape_problems` checks that it is within TOLERANCE of the recorded harness lengths.

Two requests, both with the 12 tools (`request(padded=...)`):
- unpadded: each tool with one sentence of description, no system prompt, the bare task: the tool-parsing check;
- padded: descriptions, system prompt and first-message wrapping at the recorded lengths: the context-budget check
  (judged by token count, checks.tool_exchange).
It lives below checks/ because the local real engine's scripted answer (stack.local) names the same tools.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from polarstack.pins import repo_root

HARNESS_RECORD = "configs/upstream/harness-prompt.json"  # the same record polarstack.checks.budget reads


def harness_record() -> dict[str, Any]:
    return json.loads((repo_root() / HARNESS_RECORD).read_text(encoding="utf-8"))


# Recorded tool name -> its kind (what the tool does, read from the name and parameter shape in the record).
KINDS = {
    "Agent": "subagent",
    "Bash": "shell",
    "Edit": "file_edit",
    "ListAgents": "listing",
    "Read": "file_read",
    "ReportFindings": "report",
    "ScheduleWakeup": "schedule",
    "Skill": "skill",
    "ToolSearch": "search",
    "Workflow": "workflow",
    "DeferredToolPlaceholder": "placeholder",
    "Write": "file_write",
}
# One sentence per kind, the project's own wording: the unpadded request's descriptions and each padded one's start.
KIND_SENTENCES = {
    "subagent": "Start a helper agent that works on a separate task and reports back when it is done.",
    "shell": "Run a shell command in the task workspace and return what it prints.",
    "file_edit": "Replace one exact piece of text in a file with new text.",
    "listing": "List the helper agents that are running, with their state.",
    "file_read": "Read a file from the task workspace and return its lines with line numbers.",
    "report": "Report a list of findings about the code, each with the file it is in.",
    "schedule": "Ask to be woken up again after a delay, with a note of why.",
    "skill": "Run one of the skills that are installed in this workspace.",
    "search": "Search the list of tools that are not loaded yet and load the ones that match.",
    "workflow": "Run a workflow script that calls other tools in a fixed order.",
    "placeholder": "Stands in for tools that are loaded later.",
    "file_write": "Write text to a file in the task workspace, creating it or replacing what it holds.",
}
WRITE_KIND = "file_write"
# Property descriptions by JSON type, the project's words (the record keeps no property text).
TYPE_SENTENCES = {
    "string": "A text value.",
    "number": "A number.",
    "integer": "A whole number.",
    "boolean": "True or false.",
    "array": "A list of items.",
    "object": "A set of named values.",
}
# Ordinary prose to fill a description, the system prompt or the first message to a length. Written for this
# project; it reads like guidance to a coding agent and says nothing the task depends on.
PROSE = (
    "You are a careful coding assistant working in a small project on the user's computer.",
    "Read the files you need before you change them, and keep each change as small as the task allows.",
    "When a command fails, read what it printed and fix the cause before you try again.",
    "Prefer the tools you were given over long explanations, and say briefly what you did when you are done.",
    "Do not guess at the contents of a file: open it and look.",
    "Keep the tests of the project passing, and add a test when you fix a bug.",
    "Write code that a new reader can follow, with names that say what each part is for.",
    "If the task is not clear, choose the simplest reading of it and note the choice in one line.",
    "Work in the task workspace only, and leave files outside it as they are.",
    "Each tool call should do one thing, so that its result is easy to check.",
)
# Qwen tokens per estimate_tokens of a tool schema's JSON without its description: 0.69-0.88 for the 12 schemas
# built here (measured with the record's tokenizer, 2026-12-03), so a padded description fills each tool to the
# recorded tool's whole length (`tokens`), the CLI's property texts included.
JSON_RATIO = 0.75
TOLERANCE = 0.10  # the built request's measured lengths may differ from the record's by this share
TASK = (
    "Call the Write tool exactly once to create solution.py containing a Python function add(a, b) "
    "that returns a + b. Do not answer in prose; only call the tool."
)
_TOKEN = re.compile(r"\w+|[^\w\s]")


def estimate_tokens(text: str) -> int:
    """Tokens of ordinary English text: words and punctuation marks (the record's `smoke_request` holds the Qwen
    tokenizer's count of what is built here, and shape_problems compares the two)."""
    return len(_TOKEN.findall(text))


def prose(tokens: int, start: int = 0) -> str:
    """Ordinary text of about `tokens` tokens (estimate_tokens), from PROSE, beginning at sentence `start`."""
    out: list[str] = []
    count = 0
    index = start
    while count < tokens:
        words = PROSE[index % len(PROSE)].split(" ")
        for word in words:
            if count >= tokens:
                break
            out.append(word)
            count += estimate_tokens(word)
        index += 1
    text = " ".join(out)
    return text if not text or text.endswith(".") else text + "."


def _record_turn(record: dict[str, Any] | None) -> dict[str, Any]:
    return (record or harness_record())["agent_turn"]


def _property_schema(name: str, shape: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema of the recorded shape with the project's descriptions and enum values."""
    schema: dict[str, Any] = {}
    kind = shape.get("type")
    if kind:
        schema["type"] = kind
        schema["description"] = TYPE_SENTENCES.get(kind, "A value.")
    if shape.get("enum_count"):
        schema["enum"] = [f"{name}_{index + 1}" for index in range(int(shape["enum_count"]))]
    for key in ("minimum", "maximum", "format"):
        if key in shape:
            schema[key] = shape[key]
    if isinstance(shape.get("properties"), dict):
        schema["properties"] = {prop: _property_schema(prop, sub) for prop, sub in shape["properties"].items()}
    if shape.get("required"):
        schema["required"] = list(shape["required"])
    if "additionalProperties" in shape:
        schema["additionalProperties"] = shape["additionalProperties"]
    if isinstance(shape.get("items"), dict):
        schema["items"] = _property_schema(name, shape["items"])
    return schema


def tools(padded: bool, record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The harness's tools as OpenAI function tools (what Polar's transform hands the engine): the recorded names,
    order and parameter shapes; padded, each description is as long as the recorded one (description_tokens)."""
    out = []
    for index, shape in enumerate(_record_turn(record)["tool_shapes"]):
        name = shape["name"]
        sentence = KIND_SENTENCES[KINDS[name]]
        parameters = _property_schema(name, shape.get("parameters") or {"type": "object", "properties": {}})
        parameters.pop("description", None)  # a tool's parameters carry no text of their own
        tool = {"type": "function", "function": {"name": name, "description": "", "parameters": parameters}}
        description = sentence
        if padded:
            structure = round(JSON_RATIO * estimate_tokens(json.dumps(tool, ensure_ascii=False)))
            target = max(int(shape.get("description_tokens") or 0), int(shape.get("tokens") or 0) - structure)
            rest = target - estimate_tokens(sentence)
            if rest > 0:
                description = f"{sentence} {prose(rest, start=index)}"
        tool["function"]["description"] = description
        out.append(tool)
    return out


def write_tool_name(record: dict[str, Any] | None = None) -> str:
    """The tool the task asks for (the file_write kind)."""
    return next(s["name"] for s in _record_turn(record)["tool_shapes"] if KINDS[s["name"]] == WRITE_KIND)


def messages(padded: bool, record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Unpadded: the task alone. Padded: a system prompt of the recorded length, and the task after context prose
    of the length of the CLI's wrapping (first_messages minus the task text it wrapped)."""
    if not padded:
        return [{"role": "user", "content": TASK}]
    turn = _record_turn(record)
    wrapping = int(turn["first_messages"]["tokens"]) - int(turn["task_text_in_messages"]["tokens"])
    return [
        {"role": "system", "content": prose(int(turn["system"]["tokens"]))},
        {"role": "user", "content": f"{prose(wrapping, start=3)}\n\n{TASK}"},
    ]


# Optional (never committed): the agent CLI's own captured agent-turn request (Anthropic Messages body, written by
# scripts/tools/measure_harness_prompt.py --save-request PATH wherever the pinned CLI can run, e.g. on the node after
# `make sif`). When set, the padded request carries the CLI's own system text and tools instead of the project's
# prose, its first user message with the CLI's wrapping and the smoke's task in place of the capture's prompt.
CAPTURED_ENV = "POLARSTACK_SMOKE_AGENT_REQUEST"
CAPTURE_PROMPT = "Reply with the single word OK."  # the prompt measure_harness_prompt.py captures with


def captured_parts(
    knob: str = "",
) -> tuple[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None, str | None]:
    """((tools, messages) of the captured request as the engine would get them, or None; a warning or None).
    `knob`: CAPTURED_ENV's value as the smoke's caller read it (checks.smoke_inputs.SmokeKnobs), "" when unset.
    An unreadable capture is a warning, and the project's request goes instead: the knob rides into the training
    job (checks.tool_exchange.SMOKE_KNOBS), where a host path may not exist."""
    path = knob.strip()
    if not path:
        return None, None
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
        system = body.get("system") or []
        system_text = system if isinstance(system, str) else "\n".join(b.get("text", "") for b in system)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for t in body["tools"]
        ]
        first = body["messages"][0]["content"]
        text = first if isinstance(first, str) else "\n".join(b.get("text", "") for b in first if isinstance(b, dict))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        return None, (
            f"{CAPTURED_ENV}={path} is not a readable captured agent request here ({type(exc).__name__}); the smoke "
            "sent the project's agent-length request instead."
        )
    user = text.replace(CAPTURE_PROMPT, TASK) if CAPTURE_PROMPT in text else f"{text}\n\n{TASK}"
    return (tools, [{"role": "system", "content": system_text}, {"role": "user", "content": user}]), None


def request_tokens(body: dict[str, Any]) -> int:
    """estimate_tokens of what the chat template renders from a request: its messages' text and its tools."""
    text = " ".join(str(m.get("content") or "") for m in body.get("messages") or [])
    return estimate_tokens(text) + estimate_tokens(json.dumps(body.get("tools") or [], ensure_ascii=False))


def fingerprint(padded: bool = True, record: dict[str, Any] | None = None) -> str:
    """sha256 of the padded request's tools and messages, so the record's measurement names what it measured."""
    built = {"tools": tools(padded, record), "messages": messages(padded, record)}
    return hashlib.sha256(json.dumps(built, sort_keys=True).encode()).hexdigest()


def shape_problems(record: dict[str, Any] | None = None) -> list[str]:
    """`make verify-offline` and the unit tests: the tools are the recorded 12 with their recorded parameter names,
    each of a known kind, and the padded request as measured with the Qwen tokenizer (record `smoke_request`) is of
    the recorded harness length within TOLERANCE, system prompt and whole prompt alike."""
    record = record or harness_record()
    turn = record["agent_turn"]
    problems = []
    unknown = [s["name"] for s in turn["tool_shapes"] if s["name"] not in KINDS]
    if unknown:
        return [f"recorded tools of no known kind: {unknown}; add them to agent_turn.KINDS with their kind"]
    built = tools(True, record)
    names = [t["function"]["name"] for t in built]
    if names != list(turn["tool_names"]) or len(names) != int(turn["tool_count"]):
        problems.append(f"the smoke's tools {names} are not the recorded {turn['tool_names']}")
    for shape, tool in zip(turn["tool_shapes"], built, strict=False):
        want = sorted((shape.get("parameters") or {}).get("properties") or {})
        have = sorted(tool["function"]["parameters"].get("properties") or {})
        if want != have:
            problems.append(f"tool {shape['name']} has parameters {have}, recorded {want}")
    measured = record.get("smoke_request")
    if not measured:
        problems.append(
            f"{HARNESS_RECORD} has no smoke_request measurement; run scripts/tools/measure_harness_prompt.py "
            "--smoke-request"
        )
        return problems
    if measured.get("fingerprint") != fingerprint(True, record):
        problems.append(
            f"{HARNESS_RECORD} smoke_request measured another request than checks.agent_turn builds now; "
            "rerun scripts/tools/measure_harness_prompt.py --smoke-request"
        )
    for what, have, want in (
        ("system prompt", measured["system_tokens"], turn["system"]["tokens"]),
        ("whole prompt", measured["prompt_tokens"], turn["harness_prompt_tokens"]),
    ):
        if abs(int(have) - int(want)) > TOLERANCE * int(want):
            problems.append(
                f"the smoke's padded {what} is {have} Qwen tokens, the recorded harness's {want}: more than "
                f"{TOLERANCE:.0%} apart, so the context check would not test the agent's first turn"
            )
    return problems
