"""The smoke's per-engine check on a cluster (issue 28 point 4): every engine of every node, reached from the node
the smoke runs on, must yield trainable tokens by Polar's count.

A router hides which engine answered a request, so the smoke's path exchanges (through the router, as Polar sends
them) cannot tell that every engine works: one broken engine on another node would only show as a fraction of
failed rollouts. Here one Polar-shaped request goes straight to each engine at the address the other nodes reach
it by (polarstack.stack.cluster.engine_urls), is recorded as an `Exchange` of kind "engine" and judged like the
path's answers (checks.judge, on a report of its own), and the trainable tokens are summed per engine and per node.
An engine that answers nothing trainable fails the smoke with a sentence naming its node and URL, unless the path
itself already failed (the more fundamental failure keeps the report's code; the rows still show each engine).
"""

from __future__ import annotations

from typing import Any

from polarstack.checks.exchange import SmokeReport, exchange
from polarstack.checks.judge import fail, judge
from polarstack.checks.route import Resolution, discover_model
from polarstack.checks.route import v1_url as _v1
from polarstack.checks.smoke_inputs import SmokeTarget
from polarstack.errors import ExitCode, StackError
from polarstack.http import client
from polarstack.polar import contract

PROMPT = "Write a Python function that returns the sum of a list of integers."


def _no_drift(_report: SmokeReport) -> None:
    """Straight to an engine the ids are kept; there is nothing re-tokenized to measure."""


def _check_engine(report: SmokeReport, http, url: str, max_tokens: int) -> SmokeReport:
    # the path's options (the verdict's strictness and re-tokenization rule), this engine as the whole target
    one = SmokeReport(SmokeTarget(url), report.options, Resolution("base", url, [url]), report.model)
    one.tokenizer = report.tokenizer
    try:
        if not one.model:
            one.model = discover_model(http, url)
        body = contract.prepare_request(
            {"model": one.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens}
        )
        exchange(one, http, _v1(url, "chat/completions"), body, "engine", 1)
        judge(one, _no_drift)
    except StackError as exc:
        fail(one, exc.code, exc.message)
    return one


def check_nodes(report: SmokeReport) -> None:
    """One request to every engine of the target's `nodes` (rank order; each {"rank", "addr", "engine_urls"},
    NodeLayout's shape), with the smoke's timeout and max_tokens; the rows go to report.per_engine and
    report.per_node, and the first engine without a passing answer fails a report that had passed."""
    nodes = report.target.nodes or []
    max_tokens = report.options.max_tokens
    rows: list[dict[str, Any]] = []
    with client(report.options.timeout) as http:
        for node in nodes:
            for url in node["engine_urls"]:
                one = _check_engine(report, http, url.rstrip("/"), max_tokens)
                entry = one.exchanges[0] if one.exchanges else None
                rows.append(
                    {
                        "rank": node["rank"],
                        "addr": node["addr"],
                        "url": url.rstrip("/"),
                        "verdict": "pass" if one.ok else "fail",
                        "code": one.code.name,
                        "exit_code": int(one.code),
                        "trainable_tokens": one.trainable_tokens,
                        "status": entry.status if entry is not None else None,
                        "elapsed_ms": entry.elapsed_ms if entry is not None else None,
                        "message": one.message,
                    }
                )
    report.per_engine = rows
    report.per_node = [
        {
            "rank": node["rank"],
            "addr": node["addr"],
            "engines": len(node["engine_urls"]),
            "trainable_tokens": sum(r["trainable_tokens"] for r in rows if r["rank"] == node["rank"]),
            "failed": [r["url"] for r in rows if r["rank"] == node["rank"] and r["verdict"] != "pass"],
        }
        for node in nodes
    ]
    failed = [r for r in rows if r["verdict"] != "pass"]
    if report.code != ExitCode.OK:
        return
    if failed:
        first = failed[0]
        others = f" ({len(failed) - 1} more engine(s) fail too)" if len(failed) > 1 else ""
        fail(
            report,
            ExitCode(first["exit_code"]),
            f"node {first['rank']} ({first['addr']}), engine {first['url']}: {first['message'].rstrip('.')}{others}; "
            "every engine of every node must yield trainable tokens before training.",
        )
        return
    totals = ", ".join(f"node {n['rank']} {n['trainable_tokens']}" for n in report.per_node)
    report.message = (
        f"{report.message}; each of the {len(rows)} engine(s) on {len(nodes)} node(s) yields trainable tokens "
        f"straight from the smoke's node ({totals})"
    )
