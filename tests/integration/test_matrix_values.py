"""Issue 32 point 10: the router matrix records what reaches the engine by value for Polar's request shapes (the
chat request and the smoke's tool request), so a router that rewrites a value shows; a key list cannot show it.

A fake router (a forwarder in this process, on 127.0.0.1) stands between the matrix and the emulator: faithful, or
rewriting one value (logprobs true -> false, as smg >= 1.8.0 rewrites by stripping false/null fields), or dropping
a field whose value is false (stream false). The matrix's own measure() runs on it with its install and start
replaced by the fake, so nothing is downloaded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import httpx
import pytest

from polarstack.bench import matrix
from polarstack.checks.measure import ENGINE_LOG
from polarstack.routers.catalog import RouterRelease
from polarstack.stack.profiles import stack_settings

pytestmark = pytest.mark.emulator


class FakeRouter:
    def __init__(self, upstream: str, rewrite: Callable[[dict[str, Any]], dict[str, Any]]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if raw and self.path.startswith("/v1/chat/completions"):
                    body = json.loads(raw)
                    if isinstance(body, dict):
                        raw = json.dumps(outer.rewrite(body)).encode()
                reply = httpx.request(
                    self.command,
                    f"{upstream}{self.path}",
                    content=raw or None,
                    headers={"content-type": self.headers.get("content-type") or "application/json"},
                    timeout=30,
                )
                self.send_response(reply.status_code)
                self.send_header("content-type", reply.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = do_DELETE = _forward

        self.rewrite = rewrite
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.startup_seconds = 0.0
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def faithful(body: dict[str, Any]) -> dict[str, Any]:
    return body


def true_to_false(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "logprobs": False} if body.get("logprobs") is True else body


def strip_false_and_null(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not False and v is not None}


def measure_behind(monkeypatch, engine_factory, rewrite) -> dict[str, Any]:
    first, spare = engine_factory(seed=0), engine_factory(seed=1)
    routers: list[FakeRouter] = []

    def start(release, urls, **options):
        routers.append(FakeRouter(urls[0], rewrite))
        return routers[-1]

    monkeypatch.setattr(matrix, "install", lambda release: None)
    monkeypatch.setattr(matrix, "is_installed", lambda release: True)
    monkeypatch.setattr(matrix, "start_router", start)
    model = matrix.served_model(stack_settings())  # the stack's SERVED_MODEL_NAME
    engines = matrix.Engines("emulator", first.url, spare.url, ENGINE_LOG, timeout=10.0, model=model)
    return matrix.measure(RouterRelease("smg", "0.0.0-fake"), engines, latency_requests=1)


def test_a_router_that_rewrites_a_value_is_caught_by_the_value_record_not_by_the_key_list(monkeypatch, engine_factory):
    honest = measure_behind(monkeypatch, engine_factory, faithful)
    rewriting = measure_behind(monkeypatch, engine_factory, true_to_false)
    assert honest.get("note") is None and rewriting.get("note") is None, (honest, rewriting)
    # what the key list and the flag column see: the same for both
    assert honest["request_keys_at_engine"] == rewriting["request_keys_at_engine"]
    assert honest["chat_flags_reach_engine"] is rewriting["chat_flags_reach_engine"] is True
    # what the value record sees
    for shape in ("chat", "tools"):
        assert honest["request_at_engine"][shape]["reached"] is True
        assert (
            honest["request_at_engine"][shape]["changed"] == {} and honest["request_at_engine"][shape]["dropped"] == []
        )
        changed = rewriting["request_at_engine"][shape]["changed"]
        assert changed == {"logprobs": {"sent": True, "at_engine": False}}, changed
        assert rewriting["request_at_engine"][shape]["values"]["logprobs"] is False
    tools = honest["request_at_engine"]["tools"]["values"]
    assert tools["tool_choice"] == "auto" and tools["tools"].startswith("sha256:") and tools["stream"] is False


def test_a_router_that_strips_false_values_shows_the_dropped_field(monkeypatch, engine_factory):
    row = measure_behind(monkeypatch, engine_factory, strip_false_and_null)
    assert row.get("note") is None, row
    for shape in ("chat", "tools"):
        assert row["request_at_engine"][shape]["dropped"] == ["stream"]
        assert "stream" not in row["request_at_engine"][shape]["values"]
    assert row["request_at_engine"]["tools"]["values"]["temperature"] == 0  # 0 is not false: kept


@pytest.mark.unit
def test_value_record_lists_dropped_added_and_changed_fields():
    sent = {"a": True, "b": None, "messages": [{"role": "user", "content": "x"}], "c": 1}
    got = {"a": False, "messages": [{"role": "user", "content": "y"}], "c": 1, "d": 2}
    record = matrix.value_record(sent, got)
    assert record["dropped"] == ["b"] and record["added"] == ["d"]
    assert set(record["changed"]) == {"a", "messages"} and record["changed"]["a"] == {"sent": True, "at_engine": False}
    assert matrix.value_record(sent, None) == {"reached": False}
