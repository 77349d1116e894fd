"""Pins issue 34 point 7's "tables that fit 100 columns": every table the CLI prints (polarstack.cli.render), drawn
from the data its commands really produce (the smoke on an answer that passes and on one whose token fields a router
dropped, the demo's rows with their rehearsal part, the recorded docs/*.json of bench, routing and the router
matrices, the routers catalog, verify-offline's checks, the rehearsal's report) fits 100 columns, and no word of any
cell is cut, folded or ellipsized on the way (cells wrap at spaces; a value too long for any column is shortened
by the renderer, never cut)."""

from __future__ import annotations

import io
import json
import re
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from rich.console import Console

from polarstack.bench import matrix
from polarstack.checks import rehearsal_report, smoke
from polarstack.checks.probe import ProbeReport
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.cli import render
from polarstack.cli.main import main
from polarstack.errors import ExitCode
from polarstack.offline.check import Check
from polarstack.stack import profiles

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

import rehearsal_fakes  # noqa: E402
from smoke_answers import PROSE_MESSAGE, TOOL_ANSWER, answer  # noqa: E402

WIDTH = 100
URL = "http://127.0.0.1:31080"


def tokens(text: str) -> Counter:
    return Counter(w for w in re.split(r"[\s│┃()]+", text) if w)


@pytest.fixture(autouse=True)
def drawn(monkeypatch, capsys):
    """Every table render draws, with its own lines: the console writes into a buffer 100 columns wide (as into a
    pipe or a log), and each table's output is cut out of it as `print_table` prints it."""
    buffer = io.StringIO()
    monkeypatch.setattr(render, "console", lambda: Console(file=buffer, width=WIDTH, highlight=False, soft_wrap=False))
    tables: list[tuple[list[str], str]] = []
    show = render.print_table

    def recording(out, table):
        start = buffer.tell()
        texts = [str(column.header) for column in table.columns]
        texts += [str(cell) for column in table.columns for cell in column.cells]
        show(out, table)
        tables.append((texts, buffer.getvalue()[start:]))

    monkeypatch.setattr(render, "print_table", recording)
    yield SimpleNamespace(tables=tables, text=lambda: buffer.getvalue() + capsys.readouterr().out)


def assert_fits(drawn, cells: list[str] = ()) -> None:
    """Every line within WIDTH, no ellipsis, and every word of every header and cell of every table whole (as many
    times as the table holds it); `cells`: words printed outside a table that must not be cut either."""
    text = drawn.text()
    assert drawn.tables, "no table drawn"
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) wider than {WIDTH}: {wide[0]!r} ({len(wide[0])})"
    assert "…" not in text, "a cell was ellipsized"
    for texts, out in drawn.tables:
        wanted, found = tokens(" ".join(texts)), tokens(out)
        cut = sorted(w for w, n in wanted.items() if found[w] < n)
        assert not cut, f"words cut or folded in a table: {cut[:10]}"
    outside, found = tokens(" ".join(cells)), tokens(text)
    cut = sorted(w for w, n in outside.items() if found[w] < n)
    assert not cut, f"words cut outside the tables: {cut[:10]}"


def serve(monkeypatch, body: dict) -> None:
    raw = json.dumps(body).encode()
    tool = json.dumps({"message": TOOL_ANSWER["choices"][0]["message"]})[1:-1].encode()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        content = raw.replace(PROSE_MESSAGE, tool) if json.loads(request.content).get("tools") else raw
        return httpx.Response(200, content=content, headers={"content-type": "application/json"})

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))


def dropped() -> dict:
    """An answer behind a router that dropped Polar's two request flags: neither token field comes back."""
    body = answer()
    for key in ("prompt_token_ids", "meta_info"):
        body["choices"][0].pop(key)
    return body


@pytest.mark.parametrize("body", [answer(), dropped()], ids=["passes", "fields dropped"])
def test_the_smoke_table(monkeypatch, drawn, body):
    serve(monkeypatch, body)
    report = smoke.run_smoke(SmokeTarget(URL), SmokeOptions())
    render.render_smoke(report)
    problems = [f["message"] for e in report.exchanges for f in e.get("verdict", {}).get("problems", [])]
    assert bool(problems) == (body != answer())  # said below the table, each once, whole
    assert_fits(drawn, sorted(set(problems)) + report.warnings)


def test_the_smoke_table_of_requests_to_several_urls(drawn):
    """Polar's route resolved to the engines, and NODES>1's line per engine: each URL said whole, outside the table."""
    urls = [f"http://127.0.0.1:{port}/v1/chat/completions" for port in (30000, 30001)] + [f"{URL}/generate"]
    exchanges = [
        {"kind": "single", "turn": 1, "url": url, "status": 200, "elapsed_ms": 3.2, "verdict": {}, "polar": {}}
        for url in urls
    ]
    engine = {"rank": 1, "addr": "198.18.250.2", "url": "http://198.18.250.2:30000", "trainable_tokens": 0}
    engine.update(verdict="fail", code="UNREACHABLE", message="engine http://198.18.250.2:30000 did not answer " * 3)
    report = SimpleNamespace(
        resolution=SimpleNamespace(route="polar", base_url=URL, note="Polar resolves its workers"),
        model="m",
        exchanges=exchanges,
        per_engine=[engine],
        per_node=[],
        warnings=[],
        ok=False,
        code=ExitCode.UNREACHABLE,
        polar_verdict="not_trainable",
        trainable_tokens=0,
        elapsed=0.1,
    )
    render.render_smoke(report)
    assert_fits(drawn, [*urls, engine["message"]])


def test_the_probe_table(drawn):
    keys = ["finish_reason", "index", "logprobs", "matched_stop", "message", "meta_info", "prompt_token_ids"]
    side = {"url": f"{URL}/v1/chat/completions", "status": 200, "bytes": 1234, "choice_keys": keys}
    report = ProbeReport(
        direct={**side, "trainable_tokens": 12},
        via={**side, "choice_keys": keys[:5], "trainable_tokens": 0},
        diagnosis="request fields dropped on the way in",
        evidence="the engine's request log has no return_prompt_token_ids or return_meta_info",
    )
    render.render_probe(report)
    assert_fits(drawn, [report.evidence])
    assert f"{URL}/v1/chat/completions".removeprefix("http://") in drawn.tables[0][0]  # one word of 35, not 42


def demo_rows() -> list[dict]:
    rows = []
    for name in profiles.PROFILE_ORDER:
        profile = profiles.load(name)
        passes = profile.expect == "pass"
        row = {"profile": name, "router": profile.router.spec if profile.router else "none", "expected": profile.expect}
        row.update(verdict="pass" if passes else profile.expect, trainable_tokens=91 if passes else 0)
        row.update(smoke_seconds=3.512, as_expected=True)
        if passes:
            tool = {"targets": [{"outcome": rehearsal_report.PARSED_OUTCOME}] * 2}
            row["rehearsal"] = [v.as_dict() for v in rehearsal_report.local_part([30, 31, 30], tool)]
        rows.append(row)
    return rows


@pytest.mark.parametrize("engine", ["emulator", "sglang==0.5.6.post2 in Docker containers"])
def test_the_demo_tables(drawn, engine):
    rows = demo_rows()
    render.render_demo(rows, 12.3, engine=engine)
    assert_fits(drawn)
    assert len(drawn.tables) == 2  # the profiles, then the part of the rehearsal's report measured here


def test_the_bench_tables(drawn):
    data = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    render.render_bench(data, {"markdown": "docs/benchmarks.md", "json": "docs/benchmarks.json", "plot": "x.png"})
    assert_fits(drawn)


def test_the_routing_table(drawn):
    data = json.loads((ROOT / "docs" / "routing.json").read_text())
    render.render_routing_bench(data, {"markdown": "docs/routing.md", "json": "docs/routing.json", "plot": "x.png"})
    assert_fits(drawn)


@pytest.mark.parametrize("recorded", ["router-matrix.json", "router-matrix-sglang.json"])
def test_the_router_matrix_table(drawn, recorded):
    rows = json.loads((ROOT / "docs" / recorded).read_text())["rows"]
    rows[0] = {**rows[0], "note": "did not start: error: unrecognized arguments: --prometheus-host 127.0.0.1"}
    render.render_matrix(rows)
    assert_fits(drawn, [rows[0]["note"]])
    shown = {key for texts, _ in drawn.tables for key in texts}
    assert all(title in shown for key, title in matrix.COLUMNS if key != "chat_fields_reach_client")  # every column


def test_the_routers_catalog_table(drawn, capsys):
    assert main(["routers", "catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(["routers", "catalog"]) == 0
    assert_fits(drawn, sorted({row["module"] for row in rows}))  # said below the table


def test_the_verify_offline_table(drawn):
    checks = [
        Check("compose.yaml renders for every profile at one node (engine-direct, router-passthrough, ...)", True),
        Check(
            "smg==1.13.0 parses the rendered router arguments of patched-router with the pinned release's own parser",
            False,
            problems=[
                "--worker-startup-timeout-secs 240 is not an argument of this release (it knows "
                "--worker-startup-timeout-secs-total); the router would exit 2 at start",
                "ROUTER_PORT=31080 collides with RAY_DASHBOARD_PORT=31080",
            ],
        ),
    ]
    render.render_verify_offline(checks, 4.2)
    assert_fits(drawn)


@pytest.mark.parametrize("passing", [True, False])
def test_the_rehearsal_report_table(drawn, passing):
    evidence = rehearsal_fakes.passing_evidence()
    if not passing:  # a failing class prints what to change: a group of 4 samples without trainable tokens
        samples = [[rehearsal_fakes.sample(1.0, trainable=False)] * 4] + rehearsal_fakes.mixed_groups()
        evidence["rollouts"] = [
            {**rehearsal_fakes.summary(r, samples), "phase": "train" if r < 2 else "resume"} for r in range(3)
        ]
    result = rehearsal_report.report(evidence)
    assert result["passed"] == passing
    render.render_rehearsal_report(result)
    assert_fits(drawn)
