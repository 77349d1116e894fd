"""`polarstack smoke`: send Polar-shaped requests down the configured path and prove trainable tokens.

Two routes, `base` and `polar` (Polar's InferenceClient, which may bypass the router): polarstack.checks.route
(../shared/reference/polar-contract.md, "Which URL Polar actually calls").

Go/no-go comes from polar_model (Polar's own pipeline on the raw answer bytes): 0 when Polar would extract
trainable tokens from every answer; otherwise the most fundamental failure wins (unreachable, HTTP error, a body
Polar's orjson parser rejects = MALFORMED, token fields dropped on the path = TOKENS_MISSING, fields present but
Polar extracts nothing = INVARIANT). Findings Polar does not enforce are warnings (exit 4 with strict=True);
answers Polar could train on only by re-tokenizing text are refused with RETOKENIZED unless allow_retokenized.
The judging lives in polarstack.checks.judge; see docs/polar-verdict.md. After the plain requests, one Polar-shaped
request carrying a tool schema goes to every target and is judged the same way, then for its tool call
(toolcheck; docs/tool-calls.md). Each request and its answer is an `Exchange`, a row of the report's `requests`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from polarstack.checks import per_engine, retokenize, tool_exchange
from polarstack.checks.exchange import Exchange, SmokeReport, exchange  # noqa: F401 (re-exported)
from polarstack.checks.judge import (  # noqa: F401 - WORKING_PROFILES re-exported for probe
    WORKING_PROFILES,
    judge,
    judge_with_tool_failure,
)
from polarstack.checks.judge import fail as _fail
from polarstack.checks.route import (
    Resolution,
    discover_model,
    resolve,  # noqa: F401 - re-exported
)
from polarstack.checks.route import root_url as _root  # noqa: F401 - re-exported for probe
from polarstack.checks.route import v1_url as _v1
from polarstack.errors import ExitCode, StackError
from polarstack.http import client, request
from polarstack.polar import contract, diagnostics
from polarstack.routers import worker_api

SINGLE_PROMPTS = (
    "Write a Python function that returns the sum of a list of integers.",
    "Explain in one sentence what a unit test is.",
    "Write a Python function is_palindrome(s) that ignores case.",
    "List three uses of a hash map.",
)
FOLLOW_UPS = (
    "Now add a docstring.",
    "Add a test for the empty input.",
    "Make it handle None.",
    "Summarize the change.",
)


def run_smoke(
    base_url: str,
    *,
    model: str | None = None,
    requests: int = 2,
    turns: int = 2,
    timeout: float = 10.0,
    route: str = "base",
    max_tokens: int = 16,
    register: list[str] | None = None,
    strict: bool = False,
    allow_retokenized: bool = False,
    tokenizer_name: str | None = None,
    engine_urls: list[str] | None = None,
    agent_env: dict[str, str] | None = None,
    tool_fields: dict[str, Any] | None = None,
    tool_unscripted: str | None = None,
    nodes: list[dict[str, Any]] | None = None,
) -> SmokeReport:
    """`nodes`: on a cluster (NODES>1), every node's engines ({"rank", "addr", "engine_urls"}): after the path's
    requests, each engine of each node gets one of its own (checks.per_engine), reported per engine and per node."""
    verdict_options = {
        "strict": strict,
        "allow_retokenized": allow_retokenized,
        "tokenizer_name": tokenizer_name,
        "engine_urls": engine_urls or list(register or []),
        "agent_env": agent_env,
        "tool_fields": tool_fields,
        "tool_unscripted": tool_unscripted,
        "nodes": nodes,
    }
    if register:
        try:
            with worker_api.registered(base_url.rstrip("/"), register, timeout):
                return run_smoke(
                    base_url,
                    model=model,
                    requests=requests,
                    turns=turns,
                    timeout=timeout,
                    route=route,
                    max_tokens=max_tokens,
                    **verdict_options,
                )
        except StackError as exc:
            report = SmokeReport(Resolution(route, base_url.rstrip("/"), [base_url.rstrip("/")]), model or "")
            return _fail(report, exc.code, exc.message)
    """Send `requests` single-turn requests and one `turns`-turn session; never raises StackError for the
    path's failures (they become the report's code and message), only for bad arguments."""
    if requests < 0 or turns < 0 or requests + turns == 0:
        raise StackError("--requests and --turns must be >= 0 and not both 0.", ExitCode.USAGE)
    if timeout <= 0:
        raise StackError("--timeout must be positive.", ExitCode.USAGE)
    started = time.perf_counter()
    tool_failure: StackError | None = None
    with client(timeout) as http:
        resolution = Resolution("base", base_url.rstrip("/"), [base_url.rstrip("/")])
        report = SmokeReport(
            resolution,
            model or "",
            strict=strict,
            allow_retokenized=allow_retokenized,
            tokenizer_name=tokenizer_name,
            engine_urls=list(verdict_options["engine_urls"]),
            agent_env=agent_env,
            tool_fields=tool_fields,
            tool_unscripted=tool_unscripted,
        )
        try:
            if tokenizer_name:
                report.tokenizer = retokenize.load(tokenizer_name)
            report.resolution = resolution = resolve(base_url, route, http, requests + turns)
            report.model = model or discover_model(http, resolution.targets[0])
            _exchange_all(report, http, requests, turns, max_tokens)
            # issue 10 point 4: one Polar-shaped request carrying a tool schema per target, judged like the others
            try:
                tool_exchange.exchange_tools(report, http)
            except StackError as exc:  # judged after the token exchanges (judge.judge_with_tool_failure)
                tool_failure = exc
        except StackError as exc:
            report.code, report.message = exc.code, exc.message
        report.elapsed = time.perf_counter() - started
    if report.code == ExitCode.OK:
        judge_with_tool_failure(report, tool_failure, lambda r: judge(r, _measure_drift))
    if report.code == ExitCode.OK:  # issue 10 point 4: tool schemas must come back as parsed tool_calls
        tool_exchange.judge_tool_calls(report)
    if nodes:  # issue 28 point 4: every engine of every node, from this node
        started = time.perf_counter()
        per_engine.check_nodes(report, nodes, timeout, max_tokens)
        report.elapsed += time.perf_counter() - started
    return report


def _exchange_all(report: SmokeReport, http, requests: int, turns: int, max_tokens: int) -> None:
    targets = report.resolution.targets
    counter = 0

    def send(messages: list[dict[str, Any]], kind: str, turn: int) -> dict[str, Any] | None:
        nonlocal counter
        target = targets[counter % len(targets)]
        counter += 1
        body = contract.prepare_request({"model": report.model, "messages": messages, "max_tokens": max_tokens})
        return exchange(report, http, _v1(target, "chat/completions"), body, kind, turn)

    for index in range(requests):
        send([{"role": "user", "content": SINGLE_PROMPTS[index % len(SINGLE_PROMPTS)]}], "single", 1)
    if turns:
        messages: list[dict[str, Any]] = [{"role": "user", "content": SINGLE_PROMPTS[0]}]
        previous: list[int] = []
        for turn in range(1, turns + 1):
            parsed = send(list(messages), "session", turn)
            prompt_ids = report.exchanges[-1].prompt_ids
            if turn > 1:
                problem = diagnostics.check_prefix(previous, prompt_ids)
                if problem:
                    report.warnings.append(problem.message)
            previous = prompt_ids
            content = ""
            if parsed:
                message = parsed["choices"][0].get("message") if isinstance(parsed["choices"][0], dict) else None
                content = message.get("content") or "" if isinstance(message, dict) else ""
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]},
            ]


def _measure_drift(report: SmokeReport) -> None:
    """Send the smoke's own requests straight to an engine that keeps the ids and compare them with the ids
    re-tokenized from the same answer's text (retokenize.drift)."""
    if report.tokenizer is None or not report.engine_urls:
        return
    totals = {"responses": 0, "sampled_tokens": 0, "differing_positions": 0, "engine_urls": report.engine_urls}
    with client(30.0) as http:
        for index, entry in enumerate(report.exchanges):
            body = entry.request
            if body is None:
                continue
            url = _v1(report.engine_urls[index % len(report.engine_urls)], "chat/completions")
            try:
                reply = request(http, "POST", url, body)
                parsed = json.loads(reply.body) if 200 <= reply.status < 300 else None
            except (StackError, ValueError):
                continue
            measured = retokenize.drift(report.tokenizer, parsed) if isinstance(parsed, dict) else None
            if measured is None:
                continue
            totals["responses"] += 1
            totals["sampled_tokens"] += measured["sampled_tokens"]
            totals["differing_positions"] += measured["differing_positions"]
    if totals["responses"]:
        report.drift = totals
