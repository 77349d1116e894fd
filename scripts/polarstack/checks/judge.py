"""The smoke's go/no-go: Polar's count on the recorded exchanges decides, the most fundamental failure wins.

Pure: reads a SmokeReport's exchanges (exchange.Exchange) and sets its code, message, warnings, findings and
fields_missing; the only I/O is the drift measurement the caller passes in (smoke._measure_drift), called only when
Polar would train on re-tokenized ids. Exit codes and sentences: docs/polar-verdict.md.
"""

from __future__ import annotations

from typing import Any, Callable

from polarstack.checks import retokenize
from polarstack.errors import ExitCode
from polarstack.polar import diagnostics
from polarstack.polar import findings as polar_findings
from polarstack.polar.verdict import NOT_TRAINABLE, RETOKENIZED, TRAINABLE

WORKING_PROFILES = "engine-direct, router-passthrough or patched-router"


def fail(report: Any, code: ExitCode, message: str) -> Any:
    report.code, report.message = code, message
    return report


def judge(report: Any, measure_drift: Callable[[Any], None]) -> None:
    """Go/no-go from Polar's count alone (polar_model); polar.diagnostics' problems only name what is missing."""
    verdicts = [e.verdict for e in report.exchanges]
    polars = [e.polar for e in report.exchanges]
    report.warnings += [p["message"] for v in verdicts for p in v["problems"] if p["kind"] == diagnostics.WARNING]
    if report.resolution.bypassed:
        report.warnings.append(report.resolution.note)
    disagree = [
        e
        for e in report.exchanges
        if e.installed_polar is not None and e.installed_polar["trainable_tokens"] != e.polar["polar_trainable_tokens"]
    ]
    if disagree:
        entry = disagree[0]
        fail(
            report,
            ExitCode.INTERNAL,
            f"polarstack's verdict model disagrees with the installed Polar on the answer from {entry.url} "
            f"({entry.polar['polar_trainable_tokens']} trainable tokens vs Polar's "
            f"{entry.installed_polar['trainable_tokens']}, which ended at {entry.installed_polar['ended']}); "
            "the verdict cannot be trusted, so the gate refuses: report this polarstack bug.",
        )
        return
    zero = [(e, p) for e, p in zip(report.exchanges, polars, strict=False) if p["polar_trainable_tokens"] == 0]
    retokenized = [p for p in polars if p["polar_verdict"] == RETOKENIZED]
    report.polar_verdict = NOT_TRAINABLE if zero else RETOKENIZED if retokenized else TRAINABLE
    seen: set[tuple[str, str]] = set()
    for polar in polars:
        for finding in polar["warnings"]:
            if (finding["code"], finding["path"]) not in seen:
                seen.add((finding["code"], finding["path"]))
                report.findings.append(finding)
                report.warnings.append(f"{finding['code']}: {finding['message']}")
    where = ", ".join(sorted({e.url for e in report.exchanges}))
    if zero:
        _judge_zero(report, zero)
        return
    if retokenized:
        measure_drift(report)
        measured = report.drift or {}
        drift = (
            f"measured drift on this smoke's requests: {measured['differing_positions']} of "
            f"{measured['sampled_tokens']} tokens differ"
            if measured.get("sampled_tokens") is not None
            else "drift not measured: no engine-direct URL answered with token ids"
        )
        if not report.options.allow_retokenized:
            fail(
                report,
                ExitCode.RETOKENIZED,
                "Polar would train only on ids its builder re-tokenizes from text with "
                f"{report.options.tokenizer_name!r}, because the path to {where} drops the token ids; "
                f"{retokenize.RISK} ({drift}); use a profile that keeps the ids, or pass --allow-retokenized to "
                "accept the risk.",
            )
            return
        report.warnings.append(
            f"retokenized: Polar trains on ids re-tokenized from text ({drift}); allowed by --allow-retokenized"
        )
    fatal = [f for f in report.findings if f["code"] in polar_findings.TRAINER_FATAL]
    if fatal:
        fail(
            report,
            ExitCode.INVARIANT,
            f"Polar would keep the answers from {where}, but the trainer cannot: {fatal[0]['message']} (at "
            f"{fatal[0]['path']}); no batch holding such an id is trained on, so fix the engine or the path first.",
        )
        return
    if report.options.strict and report.findings:
        first = report.findings[0]
        fail(
            report,
            ExitCode.INVARIANT,
            f"--strict: {first['message']} (at {first['path']}; {len(report.findings)} finding(s) Polar does not "
            "enforce); fix the engine or drop --strict.",
        )
        return
    report.code = ExitCode.OK
    report.message = (
        f"{report.trainable_tokens} trainable tokens (Polar's count) from {len(verdicts)} responses via "
        f"{', '.join(report.resolution.targets)}"
        + (f"; {len(report.findings)} warning(s) Polar does not enforce" if report.findings else "")
    )


def _judge_zero(report: Any, zero: list[tuple[Any, dict[str, Any]]]) -> None:
    """Some answer gives Polar zero trainable tokens: TOKENS_MISSING when no such answer carries the token fields
    (the path dropped the request flags), INVARIANT when they are there and Polar still extracts nothing."""
    # Which fields the zero-token answers lack (a path may drop them only on some requests, e.g. with tools).
    keys = [set(e.verdict["choice_keys"]) for e, _ in zero]
    where = ", ".join(sorted({e.url for e, _ in zero}))
    lost = []
    if not any("prompt_token_ids" in k or "input_token_ids" in k for k in keys):
        lost.append("return_prompt_token_ids")
    if not any("meta_info" in k for k in keys):
        lost.append("return_meta_info")
    report.fields_missing = lost
    if lost:
        answers = " and ".join(
            f"`{'prompt_token_ids' if f == 'return_prompt_token_ids' else 'meta_info'}`" for f in lost
        )
        # With a builder tokenizer Polar re-tokenizes what it can; name the requests it could not rebuild
        # (tool requests: sglang renders its own dump of the tools, see docs/tool-calls.md).
        kinds = sorted({e.kind for e, _ in zero})
        rebuilt = (
            f" (Polar's re-tokenization with {report.options.tokenizer_name!r} cannot rebuild the {'/'.join(kinds)} "
            f"request(s) either: {zero[0][1]['polar_reason']})"
            if report.tokenizer is not None
            else ""
        )
        fail(
            report,
            ExitCode.TOKENS_MISSING,
            f"zero trainable tokens: every request set {' and '.join(lost)} but no response from {where} carries "
            f"{answers}{rebuilt}, so something on the path dropped those request fields before the engine "
            f"(sglang-router 0.1.5-0.3.2 and smg <= 1.4.1 do); use the {WORKING_PROFILES} profile, and run "
            "`polarstack probe` to confirm.",
        )
    else:
        entry, polar = zero[0]
        detail = next((p["message"] for p in entry.verdict["problems"] if p["kind"] == diagnostics.MISSING), "")
        fail(
            report,
            ExitCode.INVARIANT,
            f"Polar would extract zero trainable tokens from {entry.url} although the token fields are "
            f"there: {polar['polar_reason']} (at Polar's {polar['polar_stage']} step"
            f"{'; ' + detail if detail else ''}); fix the engine before training.",
        )


def judge_with_tool_failure(report: Any, tool_failure: Any, run_judge: Callable[[Any], None]) -> None:
    """Every failure the exchanges found, the most fundamental first (issue 18 point 9).

    The token exchanges run before the tool request; when the tool request itself fails (an HTTP error such as
    sglang-router 0.1.9's 422 on Polar's tool_choice, or the engine's context refusal), the token verdict is still
    judged on the exchanges that answered. A token failure (e.g. both request fields dropped, exit 3) is the more
    fundamental one: it is the report's code and comes first in its one sentence, the tool failure follows; when
    the tokens pass, the tool failure is the report's failure."""
    if tool_failure is None:
        run_judge(report)
        return
    answered = [e for e in report.exchanges if e.verdict is not None]
    unanswered = [e for e in report.exchanges if e.verdict is None]
    if answered:
        report.exchanges = answered
        run_judge(report)
        report.exchanges = answered + unanswered
    if report.code == ExitCode.OK:
        report.code, report.message = tool_failure.code, tool_failure.message
        return
    report.failures = [
        {"code": int(report.code), "name": ExitCode(report.code).name, "message": report.message},
        {"code": int(tool_failure.code), "name": ExitCode(tool_failure.code).name, "message": tool_failure.message},
    ]
    report.message = (
        f"{report.message.rstrip('.')}; it also found that {tool_failure.message[0].lower()}{tool_failure.message[1:]}"
    )
