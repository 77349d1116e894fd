"""`polarstack smoke`: send Polar-shaped requests down the configured path and prove trainable tokens.

Two routes, `base` and `polar` (Polar's InferenceClient, which may bypass the router): polarstack.smoke_route
(../shared/reference/polar-contract.md, "Which URL Polar actually calls").

Go/no-go comes from polar_model (Polar's own pipeline on the raw answer bytes): 0 when Polar would extract
trainable tokens from every answer; otherwise the most fundamental failure wins (unreachable, HTTP error, a body
Polar's orjson parser rejects = MALFORMED, token fields dropped on the path = TOKENS_MISSING, fields present but
Polar extracts nothing = INVARIANT). Findings Polar does not enforce are warnings (exit 4 with strict=True);
answers Polar could train on only by re-tokenizing text are refused with RETOKENIZED unless allow_retokenized.
The judging lives in polarstack.smoke_judge; see docs/polar-verdict.md. After the plain requests, one Polar-shaped
request carrying a tool schema goes to every target and is judged the same way, then for its tool call
(toolcheck; docs/tool-calls.md). Each request and its answer is an `Exchange`, a row of the report's `requests`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from polarstack import contract, polar_model, polar_opinion, retokenize, toolcheck, worker_api
from polarstack.errors import ExitCode, StackError
from polarstack.http import client, error_message, request
from polarstack.smoke_judge import WORKING_PROFILES, judge  # noqa: F401 - WORKING_PROFILES re-exported for probe
from polarstack.smoke_judge import fail as _fail
from polarstack.smoke_route import (
    Resolution,
    discover_model,
    resolve,  # noqa: F401 - re-exported
)
from polarstack.smoke_route import root_url as _root  # noqa: F401 - re-exported for probe
from polarstack.smoke_route import v1_url as _v1

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


@dataclass
class Exchange:
    """One smoke request and its answer; `as_dict()` is its row in the report's `requests` (keys appear once known).

    Rows are also read by key (`entry["polar"]`, `"installed_polar" in entry`, `entry.get("verdict", {})`), as
    the JSON report is; `prompt_ids` and `request` are the smoke's own and never reported."""

    kind: str  # "single", "session" or "tools"
    turn: int
    url: str
    status: int
    elapsed_ms: float
    bytes: int
    verdict: dict[str, Any] | None = None  # contract.analyze_response, once the answer is a chat completion
    polar: dict[str, Any] | None = None  # polar_model.decide: Polar's count, the basis of the verdict
    installed_polar: dict[str, Any] | None = None  # the installed Polar's second opinion (inside the trainer)
    tool_outcome: str | None = None  # kind "tools": toolcheck.classify's outcome, calls and finish_reason
    tool_calls: int = 0
    finish_reason: str | None = None
    prompt_ids: list[int] | None = field(default=None, repr=False)  # the session's prefix check
    request: dict[str, Any] | None = field(default=None, repr=False)  # re-sent to measure re-tokenization drift

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "turn": self.turn,
            "url": self.url,
            "status": self.status,
            "elapsed_ms": self.elapsed_ms,
            "bytes": self.bytes,
        }
        for key in ("verdict", "polar", "installed_polar"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.tool_outcome is not None:
            data.update(tool_outcome=self.tool_outcome, tool_calls=self.tool_calls, finish_reason=self.finish_reason)
        return data

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)


@dataclass
class SmokeReport:
    resolution: Resolution
    model: str
    exchanges: list[Exchange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code: ExitCode = ExitCode.OK
    message: str = ""
    fields_missing: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    strict: bool = False  # findings Polar does not enforce fail with INVARIANT
    allow_retokenized: bool = False
    tokenizer_name: str | None = None  # the builder tokenizer of the guarded Polar config (None: no re-tokenization)
    tokenizer: Any = None
    engine_urls: list[str] = field(default_factory=list)  # engine-direct URLs for the drift measurement
    findings: list[dict[str, str]] = field(default_factory=list)
    polar_verdict: str = ""
    drift: dict[str, Any] | None = None
    tool_check: dict[str, Any] | None = None  # toolcheck.exchange_tools' summary (issue 10 point 4)
    # fields added to the tool request only: the real engine's scripted tool answer (local.LocalState.tool_fields)
    tool_fields: dict[str, Any] | None = None

    @property
    def trainable_tokens(self) -> int:
        """Polar's count (polar_model), the only basis of the verdict."""
        return sum(e.polar["polar_trainable_tokens"] for e in self.exchanges if e.polar is not None)

    @property
    def ok(self) -> bool:
        return self.code == ExitCode.OK

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": "pass" if self.ok else "fail",
            "exit_code": int(self.code),
            "code": self.code.name,
            "message": self.message,
            "trainable_tokens": self.trainable_tokens,
            "polar_verdict": self.polar_verdict,
            "polar_trainable_tokens": self.trainable_tokens,
            "strict": self.strict,
            "retokenization": {
                "tokenizer_name_or_path": self.tokenizer_name,
                "allowed": self.allow_retokenized,
                "drift": self.drift,
            },
            "findings": self.findings,
            "installed_polar": (
                "not importable"
                if not any(e.installed_polar is not None for e in self.exchanges)
                else "disagrees"
                if self.code == ExitCode.INTERNAL
                else "agrees"
            ),
            "fields_missing": self.fields_missing,
            "tool_calls": self.tool_check,
            "model": self.model,
            **self.resolution.as_dict(),
            "requests": [e.as_dict() for e in self.exchanges],
            "warnings": self.warnings,
            "elapsed_seconds": round(self.elapsed, 4),
        }


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
    tool_fields: dict[str, Any] | None = None,
) -> SmokeReport:
    verdict_options = {
        "strict": strict,
        "allow_retokenized": allow_retokenized,
        "tokenizer_name": tokenizer_name,
        "engine_urls": engine_urls or list(register or []),
        "tool_fields": tool_fields,
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
    with client(timeout) as http:
        resolution = Resolution("base", base_url.rstrip("/"), [base_url.rstrip("/")])
        report = SmokeReport(
            resolution,
            model or "",
            strict=strict,
            allow_retokenized=allow_retokenized,
            tokenizer_name=tokenizer_name,
            engine_urls=list(verdict_options["engine_urls"]),
            tool_fields=tool_fields,
        )
        try:
            if tokenizer_name:
                report.tokenizer = retokenize.load(tokenizer_name)
            report.resolution = resolution = resolve(base_url, route, http, requests + turns)
            report.model = model or discover_model(http, resolution.targets[0])
            _exchange_all(report, http, requests, turns, max_tokens)
            # issue 10 point 4: one Polar-shaped request carrying a tool schema per target, judged like the others
            toolcheck.exchange_tools(report, http)
        except StackError as exc:
            report.code, report.message = exc.code, exc.message
        report.elapsed = time.perf_counter() - started
    if report.code == ExitCode.OK:
        judge(report, _measure_drift)
    if report.code == ExitCode.OK:  # issue 10 point 4: tool schemas must come back as parsed tool_calls
        toolcheck.judge_tool_calls(report)
    return report


def exchange(report: SmokeReport, http, url: str, body: dict[str, Any], kind: str, turn: int) -> dict[str, Any]:
    """POST one Polar-shaped request and record it as a smoke exchange judged by Polar's pipeline (polar_model);
    raises StackError for answers Polar cannot use at all (HTTP error, a body orjson rejects, not a completion).
    The tool-call check (toolcheck.exchange_tools) sends its requests through here too."""
    reply = request(http, "POST", url, body)
    entry = Exchange(
        kind=kind,
        turn=turn,
        url=url,
        status=reply.status,
        elapsed_ms=round(reply.elapsed * 1000, 2),
        bytes=len(reply.body),
    )
    report.exchanges.append(entry)
    if not 200 <= reply.status < 300:
        detail = error_message(reply.body)
        if reply.status == 404 and "model" in detail.lower():
            raise StackError(
                f"{url} does not serve model {report.model!r} (HTTP 404: {detail}); pass --model "
                "with the engine's served model name.",
                ExitCode.HTTP_ERROR,
            )
        raise StackError(
            f"{url} answered HTTP {reply.status} ({detail}); fix the engine or router before training.",
            ExitCode.HTTP_ERROR,
        )
    # Polar's pipeline on the raw bytes (polar_model): orjson first, as Polar's gateway parses.
    polar = polar_model.decide(reply.body, body, tokenizer=report.tokenizer)
    if polar.verdict == polar_model.UNPARSEABLE:
        raise StackError(
            f"{url} answered HTTP {reply.status} with a body {polar.reason}; Polar's request fails "
            "and nothing is trained, so fix what produces these bytes.",
            ExitCode.MALFORMED,
        )
    parsed = polar.response
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list) or not parsed["choices"]:
        raise StackError(
            f"{url} answered HTTP {reply.status} with JSON that is not a chat completion (no "
            "choices); check that the URL points at an OpenAI-compatible engine or router.",
            ExitCode.MALFORMED,
        )
    verdict = contract.analyze_response(parsed)
    entry.verdict = verdict.as_dict()
    entry.polar = polar.as_dict()
    if polar_opinion.available():  # inside the trainer: the installed Polar's own functions, a second opinion
        tokens, ended = polar_opinion.trainable_tokens(reply.body, body, report.tokenizer)
        entry.installed_polar = {"trainable_tokens": tokens, "ended": ended}
    entry.prompt_ids = polar.prompt_ids or verdict.prompt_ids
    entry.request = body
    return parsed


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
                problem = contract.check_prefix(previous, prompt_ids)
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
