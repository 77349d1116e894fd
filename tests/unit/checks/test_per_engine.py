"""Pins the smoke's per-engine check on a cluster (issue 28 point 4, checks.per_engine): with `nodes`, every engine
of every node gets one Polar-shaped request of its own and the report counts trainable tokens per engine and per
node; an engine that yields none fails the smoke with a sentence naming its node and URL. Without `nodes` (one
node) the report has no such rows. Answers come from an in-process HTTP transport keyed by host (no network)."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack.checks import per_engine, smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode
from smoke_answers import PROSE_MESSAGE, TOOL_ANSWER, answer

pytestmark = pytest.mark.unit

ROUTER = "http://198.18.7.1:30080"
NODES = [
    {"rank": 0, "addr": "198.18.7.1", "engine_urls": ["http://198.18.7.1:30000", "http://198.18.7.1:30010"]},
    {"rank": 1, "addr": "198.18.7.2", "engine_urls": ["http://198.18.7.2:30000", "http://198.18.7.2:30010"]},
]
TOOL_MESSAGE = json.dumps({"message": TOOL_ANSWER["choices"][0]["message"]})[1:-1].encode()
# An answer without Polar's token fields: what an engine (or a path) that drops them returns.
BARE = {k: v for k, v in answer()["choices"][0].items() if k not in ("prompt_token_ids", "meta_info")}


def serve(monkeypatch, broken: dict[str, str] | None = None) -> list[str]:
    """Every host answers a trainable completion, except `broken` URL -> "bare" (no token fields) or "down"
    (connection refused). Returns the URLs chat requests were sent to, in order."""
    broken = broken or {}
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if broken.get(origin) == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        sent.append(origin)
        body = answer()
        if broken.get(origin) == "bare":
            body = {**body, "choices": [BARE]}
        raw = json.dumps(body).encode()
        if json.loads(request.content).get("tools"):
            raw = raw.replace(PROSE_MESSAGE, TOOL_MESSAGE)
        return httpx.Response(200, content=raw, headers={"content-type": "application/json"})

    def make(timeout):
        return httpx.Client(transport=httpx.MockTransport(handler))

    monkeypatch.setattr(smoke, "client", make)
    monkeypatch.setattr(per_engine, "client", make)
    return sent


def test_every_engine_of_every_node_is_counted(monkeypatch):
    sent = serve(monkeypatch)
    report = smoke.run_smoke(SmokeTarget(ROUTER, nodes=NODES), SmokeOptions(requests=1, turns=0))
    assert report.ok, report.message
    engines = [url for node in NODES for url in node["engine_urls"]]
    assert sent[-4:] == engines  # one request of its own to each engine, after the path's, rank order
    rows = report.as_dict()["per_engine"]
    assert [(r["rank"], r["url"], r["verdict"]) for r in rows] == [
        (n["rank"], u, "pass") for n in NODES for u in n["engine_urls"]
    ]
    assert all(r["trainable_tokens"] == 2 for r in rows)  # answer(): two sampled tokens, each trainable
    per_node = report.as_dict()["per_node"]
    assert [(n["rank"], n["engines"], n["trainable_tokens"], n["failed"]) for n in per_node] == [
        (0, 2, 4, []),
        (1, 2, 4, []),
    ]
    assert "4 engine(s) on 2 node(s)" in report.message and "node 1 4" in report.message
    assert report.trainable_tokens == 6  # the path's count alone: the single request and the two tool requests


def test_an_engine_without_token_fields_fails_naming_its_node(monkeypatch):
    serve(monkeypatch, {"http://198.18.7.2:30010": "bare"})
    report = smoke.run_smoke(SmokeTarget(ROUTER, nodes=NODES), SmokeOptions(requests=1, turns=0))
    assert report.code == ExitCode.TOKENS_MISSING
    assert report.message.startswith("node 1 (198.18.7.2), engine http://198.18.7.2:30010: zero trainable tokens")
    node1 = report.per_node[1]
    assert node1["failed"] == ["http://198.18.7.2:30010"] and node1["trainable_tokens"] == 2


def test_an_unreachable_engine_fails_naming_its_node(monkeypatch):
    serve(monkeypatch, {"http://198.18.7.2:30000": "down"})
    report = smoke.run_smoke(SmokeTarget(ROUTER, nodes=NODES), SmokeOptions(requests=1, turns=0))
    assert report.code == ExitCode.UNREACHABLE
    assert report.message.startswith("node 1 (198.18.7.2), engine http://198.18.7.2:30000:")
    row = next(r for r in report.per_engine if r["url"] == "http://198.18.7.2:30000")
    assert row["verdict"] == "fail" and row["trainable_tokens"] == 0 and row["status"] is None


def test_a_failing_path_keeps_its_own_code_and_still_lists_every_engine(monkeypatch):
    serve(monkeypatch, {ROUTER: "bare"})
    report = smoke.run_smoke(SmokeTarget(ROUTER, nodes=NODES), SmokeOptions(requests=1, turns=0))
    assert report.code == ExitCode.TOKENS_MISSING and report.message.startswith("zero trainable tokens")
    assert [r["verdict"] for r in report.per_engine] == ["pass"] * 4  # the engines keep the ids: the path drops them


def test_one_node_reports_no_per_engine_rows(monkeypatch):
    sent = serve(monkeypatch)
    report = smoke.run_smoke(SmokeTarget(ROUTER), SmokeOptions(requests=1, turns=0))
    assert report.ok and set(sent) == {ROUTER}
    assert "per_engine" not in report.as_dict() and "per_node" not in report.as_dict()
