"""`polarstack smoke`: send Polar-shaped requests down the configured path and prove trainable tokens.

Two routes, `base` and `polar` (Polar's InferenceClient, which may bypass the router): polarstack.checks.route
(../shared/reference/polar-contract.md, "Which URL Polar actually calls").

Go/no-go comes from polarstack.polar.model (Polar's own pipeline on the raw answer bytes): 0 when Polar would extract
trainable tokens from every answer; otherwise the most fundamental failure wins (unreachable, HTTP error, a body
Polar's orjson parser rejects = MALFORMED, token fields dropped on the path = TOKENS_MISSING, fields present but
Polar extracts nothing = INVARIANT). Findings Polar does not enforce are warnings (exit 4 with strict=True);
answers Polar could train on only by re-tokenizing text are refused with RETOKENIZED unless allow_retokenized.
The judging lives in polarstack.checks.judge; see docs/polar-verdict.md. After the plain requests, one Polar-shaped
request carrying a tool schema goes to every target and is judged the same way, then for its tool call
(polarstack.checks.tool_exchange; docs/tool-calls.md). Each request and its answer is an `Exchange`, a row of the
report's `requests`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from polarstack.checks import per_engine, retokenize, tool_exchange
from polarstack.checks.exchange import SmokeReport, exchange
from polarstack.checks.judge import fail as _fail
from polarstack.checks.judge import judge, judge_with_tool_failure
from polarstack.checks.route import Resolution, discover_model, resolve
from polarstack.checks.route import v1_url as _v1
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
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


def run_smoke(target: SmokeTarget, options: SmokeOptions) -> SmokeReport:
    """Check `target` as `options` say: with `target.register`, inside a temporary registration of those engines
    (a router that cannot register them fails the report, UNREACHABLE or as worker_api says)."""
    if not target.register:
        return _check(target, options)
    base_url = target.base_url.rstrip("/")
    try:
        with worker_api.registered(base_url, target.register, options.timeout):
            return _check(target, options)
    except StackError as exc:
        # The check did not run: as before the inputs were an object, the report names the model asked for and
        # states the verdict's options (strict, re-tokenization) at their defaults.
        untried = SmokeOptions(model=options.model, timeout=options.timeout)
        report = SmokeReport(target, untried, Resolution(target.route, base_url, [base_url]), options.model or "")
        return _fail(report, exc.code, exc.message)


def _check(target: SmokeTarget, options: SmokeOptions) -> SmokeReport:
    """Send `options.requests` single-turn requests and one `options.turns`-turn session; never raises StackError
    for the path's failures (they become the report's code and message), only for bad options. `target.nodes`: on
    a cluster (NODES>1), after the path's requests, each engine of each node gets one of its own
    (checks.per_engine), reported per engine and per node."""
    requests, turns, timeout = options.requests, options.turns, options.timeout
    if requests < 0 or turns < 0 or requests + turns == 0:
        raise StackError("--requests and --turns must be >= 0 and not both 0.", ExitCode.USAGE)
    if timeout <= 0:
        raise StackError("--timeout must be positive.", ExitCode.USAGE)
    started = time.perf_counter()
    tool_failure: StackError | None = None
    with client(timeout) as http:
        base_url = target.base_url.rstrip("/")
        report = SmokeReport(target, options, Resolution("base", base_url, [base_url]), options.model or "")
        try:
            if options.tokenizer_name:
                report.tokenizer = retokenize.load(options.tokenizer_name)
            report.resolution = resolve(target.base_url, target.route, http, requests + turns)
            report.model = options.model or discover_model(http, report.resolution.targets[0])
            _exchange_all(report, http, requests, turns, options.max_tokens)
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
    if target.nodes:  # issue 28 point 4: every engine of every node, from this node
        started = time.perf_counter()
        per_engine.check_nodes(report)
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
    engine_urls = report.target.drift_engines
    if report.tokenizer is None or not engine_urls:
        return
    totals = {"responses": 0, "sampled_tokens": 0, "differing_positions": 0, "engine_urls": engine_urls}
    with client(30.0) as http:
        for index, entry in enumerate(report.exchanges):
            body = entry.request
            if body is None:
                continue
            url = _v1(engine_urls[index % len(engine_urls)], "chat/completions")
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
