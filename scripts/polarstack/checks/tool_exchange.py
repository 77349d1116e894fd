"""The smoke's tool exchange (issue 10 point 4): a Polar-shaped request carrying one tool schema, sent to every
target and judged by Polar's verdict like the other exchanges; then the report fails unless `message.tool_calls`
came back parsed (outcomes and exit codes: docs/tool-calls.md). The parser facts it names (the pinned sglang's
`--tool-call-parser`) are in engine.tool_parser.

Why: Polar's Anthropic transform builds `tool_use` blocks only from `message.tool_calls`
(../shared/reference/gpu-node.md), and sglang fills `message.tool_calls` only when the engine runs with
`--tool-call-parser` and the request carries tools with tool_choice other than "none".
"""

from __future__ import annotations

import json
import os
from typing import Any

from polarstack.checks import budget
from polarstack.checks.exchange import exchange
from polarstack.checks.route import v1_url
from polarstack.engine.tool_parser import FLAG, PARSER_KNOB, SMOKE_TOOL  # noqa: F401 (read here by callers)
from polarstack.errors import ExitCode, StackError
from polarstack.pins import pins, repo_root
from polarstack.polar import contract

# What an agent harness sends (Polar's Anthropic -> OpenAI transform, src/polar/gateway/transform/anthropic.py,
# `AnthropicTransformer.transform_request` + `_transform_tool_choice_to_openai`, read at 08c6276, the stored
# revision nearest POLAR_COMMIT): whenever the Anthropic body has a non-empty tools list, tool_choice is set,
# defaulting to Anthropic {"type": "auto"} -> OpenAI "auto" (whether the pinned Claude Code CLI sends a tool_choice
# on agent turns is not recorded: configs/upstream/harness-prompt.json does not capture it). "required" would
# also change sglang's decoding (serving_chat.py `_process_messages`: a structure or JSON-schema constraint for
# required/named choices; `_process_tool_calls`' `is_required` branch), so it would not test the agent's path.
TOOL_CHOICE = "auto"
# By default the tool request asks the agent's own per-request max_tokens (polarstack.checks.budget: the cap rendered as
# CLAUDE_CODE_MAX_OUTPUT_TOKENS, or the CLI's default) on a prompt padded to the measured harness prompt
# (configs/upstream/harness-prompt.json), so the engine's total-token check refuses it exactly when it would refuse
# the agent's first turn (issue 18 point 2). One write_file call of a small function is far shorter (the emulator's
# is 40 tokens with its tokenizer, measured). An answer cut at max_tokens is reported as this setting.
MAX_TOKENS_ENV = "POLARSTACK_SMOKE_TOOL_MAX_TOKENS"
# The padding unit: one token per copy with the Qwen BPE (harness-prompt.json `filler`, measured) and the emulator's.
PAD_TEXT = " the"
# "0" sends the tool request without the padding (when a real model answers the padded prompt in prose); make train's
# plan still checks the per-request budget (polarstack.checks.budget).
PAD_ENV = "POLARSTACK_SMOKE_TOOL_PAD"
PAD_PREFIX = "Padding to an agent harness's prompt length; ignore it:"
# One deadline rule for the smoke's requests (issue 26 point 7), the same for `make train`'s gate on the host and the
# in-job first-rollout check: POLARSTACK_SMOKE_TIMEOUT seconds when set, else what the target itself needs (the real
# sglang on a CPU: real_sglang.SMOKE_TIMEOUT), else DEFAULT_SMOKE_TIMEOUT (chosen, not measured on a GPU). The three
# knobs reach the training job through the Ray job's runtime env (polarstack.train.plan, `smoke_knobs`).
TIMEOUT_ENV = "POLARSTACK_SMOKE_TIMEOUT"
DEFAULT_SMOKE_TIMEOUT = 30.0
SMOKE_KNOBS = (PAD_ENV, MAX_TOKENS_ENV, TIMEOUT_ENV)


def smoke_deadline(target_timeout: float | None = None) -> float:
    """Seconds each smoke request may take, by the rule above; a bad value is USAGE naming the knob."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0 or value == float("inf"):
            raise StackError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {raw!r}.", ExitCode.USAGE)
        return value
    return float(target_timeout) if target_timeout else DEFAULT_SMOKE_TIMEOUT


def smoke_knobs() -> dict[str, str]:
    """The documented smoke knobs set in this environment, for the training job's runtime env."""
    return {name: os.environ[name] for name in SMOKE_KNOBS if os.environ.get(name, "").strip()}


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
        return budget.harness_request_shape()[1]
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise StackError(f"{MAX_TOKENS_ENV} must be a positive integer, not {raw!r}.", ExitCode.USAGE)
    return value


def tool_request(model: str, max_tokens: int | None = None, pad_tokens: int = 0) -> dict[str, Any]:
    """Polar's request shape (contract.prepare_request: stream false, logprobs, the two sglang return flags) plus
    one tool schema as a harness sends it, at temperature 0 so a real model's answer is its most likely one;
    `pad_tokens` adds a system message of that many tokens (the harness's system prompt and tool schemas)."""
    messages = [{"role": "user", "content": TOOL_PROMPT}]
    if pad_tokens > 0:
        messages.insert(0, {"role": "system", "content": PAD_PREFIX + PAD_TEXT * pad_tokens})
    return contract.prepare_request(
        {
            "model": model,
            "max_tokens": max_tokens or tool_max_tokens(),
            "temperature": 0,
            "tools": [SMOKE_TOOL],
            "tool_choice": TOOL_CHOICE,
            "messages": messages,
        }
    )


CONTEXT_REFUSALS = (
    "Requested token count exceeds the model's maximum context length",
    "longer than the model's context length",
)


def context_refusal(report: Any, exc: StackError, pad_tokens: int, max_tokens: int) -> StackError | None:
    """The engine's total-token refusal of the harness-shaped tool request as one sentence naming the setting."""
    if exc.code != ExitCode.HTTP_ERROR or not any(m in exc.message for m in CONTEXT_REFUSALS):
        return None
    return StackError(
        f"the engine refused a request shaped like the agent's first turn (the harness prompt, {pad_tokens} tokens "
        f"measured, plus max_tokens {max_tokens}) because it exceeds the engine's context, so every agent session "
        f"would fail on the node; set context.agent_max_output_tokens in configs/train/defaults.yaml (rendered as "
        f"{budget.AGENT_OUTPUT_ENV} in the agent's env) so that harness + margin + rollout_max_prompt_len + "
        "rollout_max_response_len + it fit the context (`make train DRY_RUN=1` checks it).",
        ExitCode.USAGE,
    )


# The tool request's max_tokens where the real engine's script cannot reach it (exchange_tools): enough for the
# router to answer or refuse, too few for a 60 s run of random tokens on the CPU.
UNSCRIPTED_MAX_TOKENS = 8


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
    fields on tool requests fails as it would for any request (exit 3/4/7).

    `report.tool_unscripted` (the local real engine behind a router that would drop the answer's script, unless the
    resolution bypasses that router): the request still goes, so what the router does with it (a refusal, the
    dropped fields) is reported, but capped at UNSCRIPTED_MAX_TOKENS, since the unscripted random model never
    calls the tool and would run to max_tokens; its outcome is not judged and the summary says why."""
    unscripted = report.tool_unscripted if report.tool_unscripted and not report.resolution.bypassed else None
    pad = budget.harness_request_shape()[0] if os.environ.get(PAD_ENV, "1").strip() != "0" else 0
    # the plan's own agent.env when the gate passes it (make train, the in-job gate), else the defaults'
    planned = getattr(report, "agent_env", None)
    max_tokens = None if planned is None or os.environ.get(MAX_TOKENS_ENV) else budget.env_max_tokens(planned)
    body = tool_request(report.model, max_tokens=max_tokens, pad_tokens=pad)
    body = {**body, **(report.tool_fields or {})}  # tool_fields: a scripted real engine (stack.local)
    if unscripted:
        body["max_tokens"] = UNSCRIPTED_MAX_TOKENS
    summary: dict[str, Any] = {
        "targets": [],
        "tool_calls": 0,
        "max_tokens": body["max_tokens"],
        "prompt_padding_tokens": pad,
        "tool_choice": TOOL_CHOICE,
        **({"not_judged": unscripted} if unscripted else {}),
    }
    report.tool_check = summary
    for target in dict.fromkeys(report.resolution.targets):
        try:
            parsed = exchange(report, http, v1_url(target, "chat/completions"), body, "tools", 1)
        except StackError as exc:
            raise context_refusal(report, exc, pad, body["max_tokens"]) or exc from None
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
    if report.tool_check and report.tool_check.get("not_judged"):
        report.message += f"; tool-call outcome not judged: {report.tool_check['not_judged']}"
        return
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
