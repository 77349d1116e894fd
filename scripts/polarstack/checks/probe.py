"""`polarstack probe`: upstream issue #52's probe, automated, with a diagnosis of where fields are lost.

The same chat body (the issue's own) goes to the engine directly and through the path under test; the
choice keys and byte sizes are compared. To tell "request fields dropped on the way in" from "response
fields dropped on the way out", the probe uses the strongest evidence it can get:
1. the engine's own request log, when the direct URL is this project's emulator (`/_emulator/requests`):
   did `return_prompt_token_ids` / `return_meta_info` reach the engine?
2. otherwise `/generate` with `return_logprob` through the same path: its `meta_info` is a response-only
   field no router release rewrites (router-behavior.md), so if it survives, responses pass through and
   the chat fields must have been lost in the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from polarstack.checks import measure
from polarstack.checks.judge import WORKING_PROFILES
from polarstack.checks.route import discover_model
from polarstack.checks.route import root_url as _root
from polarstack.checks.route import v1_url as _v1
from polarstack.errors import ExitCode, StackError
from polarstack.http import client, error_message, request
from polarstack.polar import diagnostics

REQUEST_DROPPED = "request fields dropped on the way in"
RESPONSE_DROPPED = "response fields dropped on the way out"
PRESERVED = "token fields preserved"
ENGINE_LACKS = "engine does not return the fields even directly"


@dataclass
class ProbeReport:
    direct: dict[str, Any] = field(default_factory=dict)
    via: dict[str, Any] = field(default_factory=dict)
    diagnosis: str = ""
    evidence: str = ""
    code: ExitCode = ExitCode.OK
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "diagnosis": self.diagnosis,
            "evidence": self.evidence,
            "exit_code": int(self.code),
            "code": self.code.name,
            "message": self.message,
            "direct": self.direct,
            "via": self.via,
        }


def _chat(http, base: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = request(http, "POST", _v1(base, "chat/completions"), body)
    if not 200 <= reply.status < 300:
        raise StackError(
            f"{reply.url} answered HTTP {reply.status} ({error_message(reply.body)}).", ExitCode.HTTP_ERROR
        )
    parsed = reply.json()
    choice = parsed.get("choices", [{}])[0] if isinstance(parsed, dict) and parsed.get("choices") else {}
    verdict = diagnostics.diagnose(parsed)
    return {
        "url": reply.url,
        "status": reply.status,
        "bytes": len(reply.body),
        "choice_keys": sorted(choice) if isinstance(choice, dict) else [],
        "trainable_tokens": verdict.trainable_tokens,
    }


def _generate_keeps_meta(http, base: str) -> bool | None:
    body = measure.generate_body("Say hi in 5 words", temperature=0)
    try:
        reply = request(http, "POST", f"{_root(base)}/generate", body)
        parsed = json.loads(reply.body) if 200 <= reply.status < 300 else None
    except (StackError, ValueError):
        return None
    return measure.generate_keeps_tokens(parsed)


def _engine_saw_flags(http, direct: str) -> bool | None:
    """From the emulator's request log: did the last chat request carry both flags? None if no log."""
    try:
        reply = request(http, "GET", f"{_root(direct)}{measure.ENGINE_LOG}?path=/v1/chat/completions&limit=1")
        if not 200 <= reply.status < 300:
            return None
        entries = json.loads(reply.body).get("requests") or []
    except (StackError, ValueError, AttributeError):
        return None
    return measure.engine_saw_flags(entries)


def run_probe(direct: str, via: str, *, model: str | None = None, timeout: float = 10.0) -> ProbeReport:
    report = ProbeReport()
    with client(timeout) as http:
        try:
            name = model or discover_model(http, direct)
            body = dict(measure.ISSUE_52_BODY, model=name)
            report.direct = _chat(http, direct, body)
            report.via = _chat(http, via, body)
            saw = _engine_saw_flags(http, direct)
            report.via["engine_received_flags"] = saw
            report.via["generate_meta_info_survives"] = _generate_keeps_meta(http, via)
        except StackError as exc:
            report.code, report.message = exc.code, exc.message
            report.diagnosis = "probe failed"
            return report
    wanted = {"prompt_token_ids", "meta_info"}
    direct_has = wanted <= set(report.direct["choice_keys"])
    via_has = wanted <= set(report.via["choice_keys"])
    lost = sorted(wanted - set(report.via["choice_keys"]))
    if not direct_has:
        report.diagnosis, report.code = ENGINE_LACKS, ExitCode.TOKENS_MISSING
        report.message = (
            f"{direct} itself returns no {' / '.join(sorted(wanted - set(report.direct['choice_keys'])))} "
            "for return_prompt_token_ids / return_meta_info; the engine is not the pinned sglang "
            "(or --direct is not an engine)."
        )
        return report
    if via_has:
        report.diagnosis, report.evidence = PRESERVED, "same choice keys directly and through the path"
        report.message = f"{via} preserves prompt_token_ids and meta_info; Polar can train through it."
        return report
    saw = report.via["engine_received_flags"]
    survives = report.via["generate_meta_info_survives"]
    if saw is False or (saw is None and survives):
        report.diagnosis = REQUEST_DROPPED
        report.evidence = (
            "the engine's request log shows the chat request arrived without return_prompt_token_ids / return_meta_info"
            if saw is False
            else "/generate's meta_info passes through the same path unchanged, so responses are not "
            "rewritten and the chat request must have lost its fields"
        )
    else:
        report.diagnosis = RESPONSE_DROPPED
        report.evidence = (
            "the engine received both flags, yet the answer through the path lacks the fields"
            if saw
            else "/generate's meta_info is also lost through the path"
        )
    report.code = ExitCode.TOKENS_MISSING
    via_bytes, direct_bytes = report.via["bytes"], report.direct["bytes"]
    report.message = (
        f"{via} loses {', '.join(lost)} ({direct_bytes} bytes direct, {via_bytes} through it): "
        f"{report.diagnosis}; use the {WORKING_PROFILES} profile."
    )
    return report
