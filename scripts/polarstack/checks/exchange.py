"""One smoke exchange: a Polar-shaped request POSTed to a target, its answer judged by Polar's pipeline
(polar.model), recorded as an `Exchange` row of the `SmokeReport` (the report's `requests`). The token exchanges of
the smoke (checks.smoke) and its tool exchange (checks.tool_exchange) both send through `exchange`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polarstack.checks.route import Resolution
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode, StackError
from polarstack.http import error_message, request
from polarstack.polar import diagnostics
from polarstack.polar import model as polar_model
from polarstack.polar import opinion as polar_opinion
from polarstack.polar.verdict import UNPARSEABLE


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
    verdict: dict[str, Any] | None = None  # diagnostics.diagnose, once the answer is a chat completion
    polar: dict[str, Any] | None = None  # polar_model.decide: Polar's count, the basis of the verdict
    installed_polar: dict[str, Any] | None = None  # the installed Polar's second opinion (inside the trainer)
    tool_outcome: str | None = None  # kind "tools": tool_exchange.classify's outcome, calls and finish_reason
    tool_calls: int = 0
    finish_reason: str | None = None
    padded: bool | None = None  # kind "tools": the agent-length request (context check) or the unpadded one (parsing)
    prompt_tokens: int | None = None  # kind "tools": the engine's usage.prompt_tokens
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
            data.update(padded=bool(self.padded), prompt_tokens=self.prompt_tokens)
        return data

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)


@dataclass
class SmokeReport:
    """The smoke's results; the inputs it ran with are `target` and `options`, held apart and never changed."""

    target: SmokeTarget  # what was checked (the site)
    options: SmokeOptions  # how the check ran
    resolution: Resolution  # the route as resolved: the targets the requests went to
    model: str  # the model the requests carried (options.model, or the one discovered)
    exchanges: list[Exchange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    code: ExitCode = ExitCode.OK
    message: str = ""
    fields_missing: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    tokenizer: Any = None  # options.tokenizer_name, loaded (retokenize.load)
    findings: list[dict[str, str]] = field(default_factory=list)
    polar_verdict: str = ""
    drift: dict[str, Any] | None = None
    tool_check: dict[str, Any] | None = None  # tool_exchange.exchange_tools' summary (issue 10 point 4)
    failures: list[dict[str, Any]] = field(default_factory=list)  # every failure found, most fundamental first
    # on a cluster (NODES>1): one row per engine of every node and one per node (checks.per_engine); None elsewhere
    per_engine: list[dict[str, Any]] | None = None
    per_node: list[dict[str, Any]] | None = None

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
            "strict": self.options.strict,
            "retokenization": {
                "tokenizer_name_or_path": self.options.tokenizer_name,
                "allowed": self.options.allow_retokenized,
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
            "failures": self.failures,
            "tool_calls": self.tool_check,
            "model": self.model,
            **self.resolution.as_dict(),
            "requests": [e.as_dict() for e in self.exchanges],
            "warnings": self.warnings,
            "elapsed_seconds": round(self.elapsed, 4),
            **({"per_engine": self.per_engine, "per_node": self.per_node} if self.per_engine is not None else {}),
        }


def exchange(report: SmokeReport, http, url: str, body: dict[str, Any], kind: str, turn: int) -> dict[str, Any]:
    """POST one Polar-shaped request and record it as a smoke exchange judged by Polar's pipeline (polar_model);
    raises StackError for answers Polar cannot use at all (HTTP error, a body orjson rejects, not a completion).
    The tool-call check (tool_exchange.exchange_tools) sends its requests through here too."""
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
    if polar.verdict == UNPARSEABLE:
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
    verdict = diagnostics.diagnose(parsed)
    entry.verdict = verdict.as_dict()
    entry.polar = polar.as_dict()
    if polar_opinion.available():  # inside the trainer: the installed Polar's own functions, a second opinion
        tokens, ended = polar_opinion.trainable_tokens(reply.body, body, report.tokenizer)
        entry.installed_polar = {"trainable_tokens": tokens, "ended": ended}
    entry.prompt_ids = polar.prompt_ids or verdict.prompt_ids
    entry.request = body
    return parsed
