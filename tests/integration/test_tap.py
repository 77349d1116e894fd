"""Pins the matrix's recording relay (polarstack.bench.tap), which stands between a router and the real engine: it
must pass requests and answers through unchanged (a relay that added, dropped or rewrote a field would measure
itself, not the router), record what it was sent, and change a request only when told to (add_flags).

The upstream here is the emulator (deterministic for a fixed seed and request); against the real engine the relay
runs in the sglang tier (tests/sglang/test_real_engine.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from polarstack.bench import matrix, tap
from polarstack.processes import free_port, stop_pid

pytestmark = pytest.mark.emulator

CHAT = {
    "model": "Qwen2.5-7B-Instruct",
    "messages": [{"role": "user", "content": "Say hi in 5 words"}],
    "max_tokens": 8,
    "logprobs": True,
    "temperature": 0,
}
# Fields that differ between two calls of the same request on the same engine (a fresh id, the clock).
PER_CALL = {"id", "created", "e2e_latency", "response_sent_to_client_ts", "request_received_ts"}


@pytest.fixture
def relay(engine_factory):
    upstream = engine_factory(seed=3)
    process, url = matrix.start_tap(upstream.url)
    try:
        yield upstream, url
    finally:
        stop_pid(process.pid, process)


def _stable(value):
    """The answer without the fields that change from call to call."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in PER_CALL}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_answers_pass_through_unchanged(relay):
    upstream, url = relay
    for body in (CHAT, dict(CHAT, return_prompt_token_ids=True, return_meta_info=True)):
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=body, timeout=10)
        relayed = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert relayed.status_code == direct.status_code == 200
        assert relayed.headers["content-type"] == direct.headers["content-type"]

        # every header line as the engine wrote it, once, in its order (no date/server of the relay's own); the
        # date and the length may differ between two calls (the clock, the id)
        def lines(reply):
            return [(k, v) for k, v in reply.headers.multi_items() if k not in ("date", "content-length")]

        assert lines(relayed) == lines(direct)
        assert [k for k, _ in relayed.headers.multi_items()].count("date") == 1
        # the engine's framing is kept: a content-length for its own bytes, not a chunked rewrite
        assert relayed.headers["content-length"] == str(len(relayed.content))
        assert "transfer-encoding" not in relayed.headers and "content-length" in direct.headers
        assert _stable(relayed.json()) == _stable(direct.json())
    assert "prompt_token_ids" in relayed.json()["choices"][0]  # the flags reached the engine through the relay


def test_errors_and_streams_pass_through_unchanged(relay):
    upstream, url = relay
    for body in (dict(CHAT, model="no-such-model"), dict(CHAT, stream=True, return_prompt_token_ids=True)):
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=body, timeout=10)
        relayed = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
        assert relayed.status_code == direct.status_code
        assert _stable(relayed.json()) == _stable(direct.json())
    stream = dict(CHAT, stream=True)
    direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=stream, timeout=10)
    relayed = httpx.post(f"{url}/v1/chat/completions", json=stream, timeout=10)
    assert relayed.headers["content-type"].startswith("text/event-stream")

    def events(reply):
        lines = [ln[len("data: ") :] for ln in reply.text.splitlines() if ln.startswith("data: ")]
        return [ln if ln == "[DONE]" else _stable(json.loads(ln)) for ln in lines]

    assert events(relayed) == events(direct) and events(relayed)[-1] == "[DONE]"


def test_the_request_goes_on_as_the_sender_wrote_it():
    """No header of httpx's own (user-agent, accept, accept-encoding) is added, repeated headers stay apart, and the
    path and query keep their escapes: the upstream (a stdlib server recording what it got) sees what was sent."""
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            seen.append((self.path, list(self.headers.items())))
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.send_header("x-twice", "a")
            self.send_header("x-twice", "b")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    process, url = None, None
    try:
        process, url = matrix.start_tap(f"http://127.0.0.1:{server.server_address[1]}")
        seen.clear()  # the readiness poll's /health
        request = httpx.Request("GET", f"{url}/v1/models?x=a%2Fb&y=1&y=2", headers={"x-router": "r"})
        for name in ("user-agent", "accept", "accept-encoding"):
            request.headers.pop(name, None)
        with httpx.Client(trust_env=False) as client:
            reply = client.send(request)
        assert reply.status_code == 200 and reply.json() == {"ok": True}
        assert [v for k, v in reply.headers.multi_items() if k == "x-twice"] == ["a", "b"]
        (path, headers), names = seen[-1], [k.lower() for k, _ in seen[-1][1]]
        assert path == "/v1/models?x=a%2Fb&y=1&y=2"
        assert ("x-router", "r") in [(k.lower(), v) for k, v in headers]
        assert not {"user-agent", "accept", "accept-encoding"} & set(names), names
    finally:
        if process is not None:
            stop_pid(process.pid, process)
        server.shutdown()
        server.server_close()


def test_it_records_what_it_was_sent_and_forgets_on_delete(relay):
    upstream, url = relay
    httpx.delete(f"{url}{tap.LOG}")
    httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10)
    httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=10)
    chat = httpx.get(f"{url}{tap.LOG}", params={"path": "/v1/chat/completions"}).json()["requests"]
    assert [r["body"] for r in chat] == [CHAT]
    every = httpx.get(f"{url}{tap.LOG}").json()["requests"]
    assert [r["path"] for r in every] == ["/v1/chat/completions", "/generate"]
    httpx.delete(f"{url}{tap.LOG}")
    assert httpx.get(f"{url}{tap.LOG}").json()["requests"] == []
    # the engine got the same body the relay recorded
    assert upstream.requests("/v1/chat/completions")[-1]["body"] == CHAT


def test_add_flags_changes_the_request_only_while_on(relay):
    upstream, url = relay
    assert httpx.post(f"{url}{tap.MODE}", json={"add_flags": "yes"}).status_code == 400
    assert httpx.post(f"{url}{tap.MODE}", json={"add_flags": True}).json() == {"add_flags": True}
    choice = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).json()["choices"][0]
    assert {"prompt_token_ids", "meta_info"} <= set(choice)
    at_engine = upstream.requests()[-1]["body"]
    assert at_engine["return_prompt_token_ids"] is True and at_engine["return_meta_info"] is True
    # the relay's own log keeps the body as the sender wrote it
    assert httpx.get(f"{url}{tap.LOG}").json()["requests"][-1]["body"] == CHAT
    httpx.post(f"{url}{tap.MODE}", json={"add_flags": False}).raise_for_status()
    choice = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).json()["choices"][0]
    assert "prompt_token_ids" not in choice and "return_meta_info" not in upstream.requests()[-1]["body"]


def test_with_flags_touches_only_json_objects_on_the_flagged_routes():
    assert tap.with_flags("/generate", b'{"text": "x"}') == b'{"text": "x"}'
    assert tap.with_flags("/v1/chat/completions", b"not json") == b"not json"
    assert tap.with_flags("/v1/chat/completions", b"[1, 2]") == b"[1, 2]"
    assert json.loads(tap.with_flags("/v1/completions", b'{"prompt": "x"}')) == {
        "prompt": "x",
        "return_prompt_token_ids": True,
        "return_meta_info": True,
    }


def test_an_upstream_that_is_gone_is_a_502_with_a_sentence():
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "polarstack.bench.tap", "--port", str(port), "--upstream", dead])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # its own /_tap route answers once it listens; /health would be relayed to nothing
            try:
                httpx.get(f"{url}{tap.LOG}", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        reply = httpx.get(f"{url}/health", timeout=5)
        assert reply.status_code == 502 and "unreachable" in reply.json()["error"]
    finally:
        stop_pid(process.pid, process)


def test_a_stream_passes_through_as_it_is_generated():
    """The relay forwards each chunk when the engine sends it, not the whole answer at the end: an upstream that
    writes four events 0.3 s apart (a stdlib server; the emulator's decode time delays the whole answer instead)
    must reach the client through the relay with the same spread as directly."""

    class Drip(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path == "/health":  # start_tap's readiness poll
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()  # HTTP/1.0, no length: the answer ends when the connection closes
            for i in range(4):
                self.wfile.write(f"data: {i}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.3)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    process = None
    try:
        direct = f"http://127.0.0.1:{server.server_address[1]}"
        process, url = matrix.start_tap(direct)

        def spread(base: str) -> tuple[list[str], float]:
            lines, times = [], []
            with httpx.stream("GET", f"{base}/stream", timeout=30) as reply:
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        times.append(time.monotonic())
            return lines, times[-1] - times[0]

        lines, seconds = spread(direct)
        assert lines == [f"data: {i}" for i in range(4)] and seconds > 0.6
        lines, seconds = spread(url)
        assert lines == [f"data: {i}" for i in range(4)] and seconds > 0.6, f"all events within {seconds:.2f} s"
    finally:
        if process is not None:
            stop_pid(process.pid, process)
        server.shutdown()
        server.server_close()
