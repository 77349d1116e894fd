"""The smoke's tool exchange (issue 10 point 4, issue 32 point 6): Polar-shaped requests carrying the agent's 12
tools (engine.agent_turn), sent to every target and judged by Polar's verdict like the other exchanges; then the
report fails unless `message.tool_calls` came back parsed (outcomes and exit codes: docs/tool-calls.md). The parser
facts it names (the pinned sglang's `--tool-call-parser`) are in engine.tool_parser.

Two requests per target: the unpadded one (the 12 tools with one-sentence descriptions and the bare task) judges
tool parsing; the padded one (descriptions, system prompt and first-message wrapping at the harness's recorded
lengths) judges the context budget by token count (the engine's total-token refusal, and the prompt tokens it
counted). A padded answer in prose or cut at max_tokens is a warning when the unpadded one parsed; prose on both is
a failure. `POLARSTACK_SMOKE_TOOL_PAD=0` sends only the unpadded one.

Why: Polar's Anthropic transform builds `tool_use` blocks only from `message.tool_calls`
(../shared/reference/gpu-node.md), and sglang fills `message.tool_calls` only when the engine runs with
`--tool-call-parser` and the request carries tools with tool_choice other than "none".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from polarstack.checks import budget
from polarstack.checks.exchange import exchange
from polarstack.checks.route import v1_url
from polarstack.checks.smoke_inputs import SmokeKnobs
from polarstack.engine import agent_turn
from polarstack.engine.tool_parser import FLAG, PARSER_KNOB
from polarstack.errors import ExitCode, StackError
from polarstack.paths import load_yaml, train_defaults
from polarstack.pins import pins, repo_root
from polarstack.polar import contract

# What an agent harness sends (Polar's Anthropic -> OpenAI transform, src/polar/gateway/transform/anthropic.py,
# `AnthropicTransformer.transform_request` + `_transform_tool_choice_to_openai`, read at 08c6276, the stored
# revision nearest POLAR_COMMIT): whenever the Anthropic body has a non-empty tools list, tool_choice is set,
# defaulting to Anthropic {"type": "auto"} -> OpenAI "auto"; the pinned Claude Code CLI sends no tool_choice on its
# agent turn (configs/upstream/harness-prompt.json `agent_turn.tool_choice` null, captured). "required" would
# also change sglang's decoding (serving_chat.py `_process_messages`: a structure or JSON-schema constraint for
# required/named choices; `_process_tool_calls`' `is_required` branch), so it would not test the agent's path.
TOOL_CHOICE = "auto"
# By default the tool requests ask the agent's own per-request max_tokens (polarstack.checks.budget: the cap rendered
# as CLAUDE_CODE_MAX_OUTPUT_TOKENS, or the CLI's default); the padded one is as long as the measured harness prompt
# (configs/upstream/harness-prompt.json, engine.agent_turn), so the engine's total-token check refuses it exactly when
# it would refuse the agent's first turn (issue 18 point 2). One Write call of a small function is far shorter (the
# emulator's is about 40 tokens with its tokenizer). An answer cut at max_tokens is reported as this setting.
MAX_TOKENS_ENV = "POLARSTACK_SMOKE_TOOL_MAX_TOKENS"
# "0" sends only the unpadded tool request (no context check on the engine); make train's plan still checks the
# per-request budget (polarstack.checks.budget).
PAD_ENV = "POLARSTACK_SMOKE_TOOL_PAD"
# One deadline rule for the smoke's requests (issue 26 point 7, issue 32 point 6), the same for `make train`'s gate
# on the host and the in-job first-rollout check: POLARSTACK_SMOKE_TIMEOUT seconds when set; else
#     max(floor, prompt tokens / min_prefill_tokens_per_second + max_tokens / min_decode_tokens_per_second)
# with the rates and floor_seconds of configs/train/defaults.yaml `gate.smoke_deadline` (lower bounds for the largest
# working model, chosen, not measured on a GPU), the floor being what the target itself needs when it says (the real
# sglang on a CPU: real_sglang.SMOKE_TIMEOUT) or floor_seconds. The prompt tokens are the request's own count
# (agent_turn.request_tokens). The three knobs reach the training job through the Ray job's runtime env
# (polarstack.train.plan, `smoke_knobs`).
TIMEOUT_ENV = "POLARSTACK_SMOKE_TIMEOUT"
SMOKE_KNOBS = (PAD_ENV, MAX_TOKENS_ENV, TIMEOUT_ENV, agent_turn.CAPTURED_ENV)
# Nothing here reads the environment: the caller hands the knobs over (SmokeOptions.knobs, checks.smoke_inputs).
KNOB_FIELDS = dict(zip(SMOKE_KNOBS, ("tool_pad", "tool_max_tokens", "timeout", "agent_request"), strict=True))


def knobs_from(values: Mapping[str, str]) -> SmokeKnobs:
    """The smoke's knobs that `values` sets (an environment, or a profile's settings, stack.profiles
    .ENVIRONMENT_KNOBS), each as its raw text; "" for one it does not set."""
    return SmokeKnobs(**{field: values.get(name, "") for name, field in KNOB_FIELDS.items()})


def deadline_rule() -> dict[str, float]:
    """configs/train/defaults.yaml gate.smoke_deadline: floor_seconds and the two minimum rates, each positive."""
    rule = (load_yaml(train_defaults().read_text(encoding="utf-8")).get("gate") or {}).get("smoke_deadline") or {}
    out = {}
    for key in ("floor_seconds", "min_prefill_tokens_per_second", "min_decode_tokens_per_second"):
        value = rule.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise StackError(
                f"gate.smoke_deadline.{key} in configs/train/defaults.yaml must be a positive number, not {value!r}.",
                ExitCode.USAGE,
            )
        out[key] = float(value)
    return out


def _knob_deadline(knob: str) -> float | None:
    raw = knob.strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise StackError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {raw!r}.", ExitCode.USAGE)
    return value


def smoke_deadline(
    target_timeout: float | None = None, prompt_tokens: int = 0, max_tokens: int = 0, *, knob: str = ""
) -> float:
    """Seconds a smoke request of `prompt_tokens` asking `max_tokens` may take, by the rule above (the plain
    requests: a short prompt and 16 tokens, so the floor); `knob`: TIMEOUT_ENV's text as the caller read it
    (SmokeKnobs.timeout). A bad value is USAGE naming the knob or the setting."""
    given = _knob_deadline(knob)
    if given is not None:
        return given
    rule = deadline_rule()
    floor = float(target_timeout) if target_timeout else rule["floor_seconds"]
    needed = prompt_tokens / rule["min_prefill_tokens_per_second"] + max_tokens / rule["min_decode_tokens_per_second"]
    return round(max(floor, needed), 1)


def smoke_knobs(settings: Mapping[str, str]) -> dict[str, str]:
    """The documented smoke knobs `settings` sets (a profile's: its environment as loaded), for the training job's
    runtime env."""
    return {name: settings[name] for name in SMOKE_KNOBS if settings.get(name, "").strip()}


TOOL_PROMPT = agent_turn.TASK
# Outcomes of one tool exchange (exchange.Exchange.tool_outcome).
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
    body = tool_request("probe-model", 1, padded=True)
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
    problems += agent_turn.shape_problems()
    return problems


def tool_max_tokens(knob: str = "") -> int:
    """MAX_TOKENS_ENV's value (`knob`, as the caller read it), else the agent's own per-request max_tokens."""
    raw = knob.strip()
    if not raw:
        return budget.harness_request_shape()[1]
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise StackError(f"{MAX_TOKENS_ENV} must be a positive integer, not {raw!r}.", ExitCode.USAGE)
    return value


def tool_request(
    model: str,
    max_tokens: int | None = None,
    padded: bool = False,
    warnings: list[str] | None = None,
    knobs: SmokeKnobs | None = None,
) -> dict[str, Any]:
    """Polar's request shape (contract.prepare_request: stream false, logprobs, the two sglang return flags) plus
    the agent's 12 tools as Polar's transform hands them on (engine.agent_turn), at temperature 0 so a real model's
    answer is its most likely one; `padded`: the system prompt, descriptions and wrapping at the harness's length
    (the CLI's own, when the knobs' agent_turn.CAPTURED_ENV names a capture; an unreadable one is appended to
    `warnings`). `knobs`: the smoke's, as its caller read them (SmokeOptions.knobs); None: none set."""
    knobs = knobs if knobs is not None else SmokeKnobs()
    tools, messages = agent_turn.tools(padded), agent_turn.messages(padded)
    if padded:
        parts, warning = agent_turn.captured_parts(knobs.agent_request)
        if parts:
            tools, messages = parts
        if warning and warnings is not None:
            warnings.append(warning)
    return contract.prepare_request(
        {
            "model": model,
            "max_tokens": max_tokens or tool_max_tokens(knobs.tool_max_tokens),
            "temperature": 0,
            "tools": tools,
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
        f"recorded, plus max_tokens {max_tokens}) because it exceeds the engine's context, so every agent session "
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


def _prompt_tokens(parsed: Any) -> int | None:
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def exchange_tools(report: Any, http: Any) -> None:
    """Send the tool requests to every distinct target of the resolution: the unpadded one, then (unless
    POLARSTACK_SMOKE_TOOL_PAD=0) the agent-length one; each is recorded as a smoke exchange of kind "tools" (a
    exchange.Exchange with its tool_outcome, `padded` and the engine's prompt_tokens) and judged by Polar's pipeline
    like the others (exchange.exchange: orjson parse, decide(), findings); its trainable tokens count in the report.
    The tool-call outcomes are judged later (judge_tool_calls), only if the token verdict passed, so a path dropping
    Polar's fields on tool requests fails as it would for any request (exit 3/4/7). Each request's deadline is
    smoke_deadline's rule for its own token count (the client's deadline restored afterwards).

    `report.target.tool_unscripted` (the local real engine behind a router that would drop the answer's script,
    unless the resolution bypasses that router): the requests still go, so what the router does with them (a
    refusal, the dropped fields) is reported, but capped at UNSCRIPTED_MAX_TOKENS, since the unscripted random
    model never calls the tool and would run to max_tokens; their outcomes are not judged and the summary says
    why."""
    unscripted = report.target.tool_unscripted
    unscripted = unscripted if unscripted and not report.resolution.bypassed else None
    knobs = report.options.knobs  # the smoke's knobs, as the caller read them
    pad = knobs.tool_pad.strip() != "0"
    harness_tokens = budget.harness_request_shape()[0]
    # the plan's own agent.env when the gate passes it (make train, the in-job gate), else the defaults'
    planned = report.target.agent_env
    max_tokens = None if planned is None or knobs.tool_max_tokens else budget.env_max_tokens(planned)
    bodies = []
    for padded in (False, True) if pad else (False,):
        body = tool_request(report.model, max_tokens=max_tokens, padded=padded, warnings=report.warnings, knobs=knobs)
        body = {**body, **(report.target.tool_fields or {})}  # tool_fields: a scripted real engine (stack.local)
        if unscripted:
            body["max_tokens"] = UNSCRIPTED_MAX_TOKENS
        bodies.append((padded, body))
    floor = http.timeout.read
    deadlines = {
        padded: smoke_deadline(floor, agent_turn.request_tokens(body), body["max_tokens"], knob=knobs.timeout)
        for padded, body in bodies
    }
    summary: dict[str, Any] = {
        "targets": [],
        "tool_calls": 0,
        "max_tokens": bodies[0][1]["max_tokens"],
        "tools": len(bodies[0][1]["tools"]),
        "prompt_padding_tokens": harness_tokens if pad else 0,
        "deadline_s": {"padded" if padded else "unpadded": value for padded, value in deadlines.items()},
        "tool_choice": TOOL_CHOICE,
        **({"not_judged": unscripted} if unscripted else {}),
    }
    report.tool_check = summary
    saved = http.timeout
    try:
        for target in dict.fromkeys(report.resolution.targets):
            for padded, body in bodies:
                http.timeout = httpx.Timeout(deadlines[padded], connect=saved.connect)
                try:
                    parsed = exchange(report, http, v1_url(target, "chat/completions"), body, "tools", 1)
                except StackError as exc:
                    # either request: the agent's max_tokens on the agent's tools alone may already overflow
                    raise context_refusal(report, exc, harness_tokens, body["max_tokens"]) or exc from None
                entry = report.exchanges[-1]
                entry.tool_outcome, entry.tool_calls, entry.finish_reason = classify(parsed)
                entry.padded, entry.prompt_tokens = padded, _prompt_tokens(parsed)
                summary["targets"].append(
                    {
                        "url": entry.url,
                        "padded": padded,
                        "outcome": entry.tool_outcome,
                        "tool_calls": entry.tool_calls,
                        "finish_reason": entry.finish_reason,
                        "prompt_tokens": entry.prompt_tokens,
                    }
                )
                summary["tool_calls"] += entry.tool_calls
    finally:
        http.timeout = saved


def judge_tool_calls(report: Any) -> None:
    """Fail the report unless every target answered the unpadded tool request with parsed message.tool_calls.
    Raw `<tool_call>` text (the engine runs without the parser) on either request wins over prose, and prose over
    a cut answer: the first is a certain configuration error, the last only an inconclusive check. The padded
    request's answer in prose or cut at max_tokens is a warning when the same target's unpadded answer parsed
    (the model calls tools, but perhaps not under the full harness prompt); prose on both is a failure naming both.
    The engine's prompt_tokens for the padded request below the recorded harness length (by agent_turn.TOLERANCE)
    is a warning: the context check was then weaker than the agent's first turn."""
    if report.tool_check and report.tool_check.get("not_judged"):
        report.message += f"; tool-call outcome not judged: {report.tool_check['not_judged']}"
        return
    entries = [e for e in report.exchanges if e.kind == "tools" and e.tool_outcome is not None]
    unpadded = [e for e in entries if not e.padded]
    padded = {e.url: e for e in entries if e.padded}

    def first(outcome: str, among: list[Any]) -> Any:
        return next((e for e in among if e.tool_outcome == outcome), None)

    if (entry := first(RAW_TEXT, entries)) is not None:
        report.code = ExitCode.TOOL_CALLS
        report.message = (
            f"the tool request to {entry.url} got raw <tool_call> text in message.content "
            f"(finish_reason {entry.finish_reason!r}) instead of parsed message.tool_calls: start "
            f"every engine with {FLAG} (the model family's parser, {PARSER_KNOB} in "
            "configs/stack.env), or the agent can never call a tool and every reward is 0."
        )
        return
    if (entry := first(PROSE, unpadded)) is not None:
        long = padded.get(entry.url)
        both = " and the agent-length one too" if long is not None and long.tool_outcome == PROSE else ""
        report.code = ExitCode.TOOL_CALLS
        report.message = (
            f"the model behind {entry.url} answered the tool request in prose without calling the "
            f"tool{both} (finish_reason {entry.finish_reason!r}, no <tool_call> text) although the prompt "
            f"asked for {agent_turn.write_tool_name()} at temperature 0; this may be the model, not {FLAG}: serve an "
            f"instruct model of the family {PARSER_KNOB} names, because an agent that never calls a "
            "tool earns reward 0."
        )
        return
    if (entry := first(CUT, unpadded)) is not None:
        # USAGE (bad configuration): the smoke's own budget is too small; the engine and path are not at fault.
        report.code = ExitCode.USAGE
        report.message = (
            f"the answer to the tool request from {entry.url} was cut at max_tokens "
            f"{report.tool_check['max_tokens']} (finish_reason 'length') before the model finished, so "
            f"the smoke cannot tell whether tool calls are parsed; raise {MAX_TOKENS_ENV} and run the "
            "smoke again."
        )
        return
    harness = int(report.tool_check.get("prompt_padding_tokens") or 0)
    for entry in padded.values():
        if entry.tool_outcome in (PROSE, CUT):
            how = "in prose without calling a tool" if entry.tool_outcome == PROSE else "cut at max_tokens"
            report.warnings.append(
                f"the model behind {entry.url} answered the agent-length tool request ({entry.prompt_tokens} prompt "
                f"tokens) {how}, although it called the tool on the unpadded one: agents under the full harness "
                "prompt may call no tool; watch the first rollouts' rewards."
            )
        if entry.prompt_tokens is not None and entry.prompt_tokens < (1 - agent_turn.TOLERANCE) * harness:
            report.warnings.append(
                f"the engine at {entry.url} counted {entry.prompt_tokens} prompt tokens for the agent-length tool "
                f"request, fewer than the recorded harness prompt's {harness}: its context check is weaker than "
                "the agent's first turn."
            )
    if unpadded:
        report.message += f"; parsed tool_calls from {len(unpadded)} target(s)"
