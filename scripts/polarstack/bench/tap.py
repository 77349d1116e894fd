"""A recording relay between a router and a real engine: what `routers matrix --engine sglang` reads instead of the
emulator's request log.

The real sglang keeps no log of the request bodies it received, so the matrix puts this relay on 127.0.0.1 in front
of it and registers the relay as the router's worker. It passes every request and answer through unchanged (method,
path, query, body bytes, status, headers apart from the hop-by-hop ones, and the answer streamed as it arrives) and
records each request body. Two things only it may change, each switched on by the matrix for one step and named in
the report:

- `add_flags`: Polar's two request fields are set on chat and completions requests before they go on, so the
  engine emits the token fields although the router dropped the flags: the real-engine form of the emulator's
  `always_extensions` fault ("would the fields survive if the engine always emitted them?").

Control routes live under /_tap (the engine has none there): GET/DELETE /_tap/requests, POST /_tap/mode.
Run as `python -m polarstack.bench.tap --port P --upstream URL`.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from polarstack.polar.contract import POLAR_REQUEST_FLAGS

LOG = "/_tap/requests"
MODE = "/_tap/mode"
FLAGGED_PATHS = ("/v1/chat/completions", "/v1/completions")
# RFC 9110 section 7.6.1: connection-specific fields a relay must not forward.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
# A request's host and length are the relay's own (the length changes when add_flags rewrites the body); an
# answer keeps its content-length, so the router sees the engine's framing, not a chunked rewrite.
REQUEST_ONLY = {"host", "content-length"}


def _forwardable(headers: Any, drop: set[str] = HOP_BY_HOP) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k.lower() not in drop]


def with_flags(path: str, body: bytes) -> bytes:
    """`body` with Polar's two flags set when it is a JSON object posted to a chat or completions route."""
    if path not in FLAGGED_PATHS:
        return body
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict):
        return body
    return json.dumps({**parsed, **{flag: True for flag in POLAR_REQUEST_FLAGS}}).encode()


def build_app(upstream: str) -> FastAPI:
    state: dict[str, Any] = {"requests": [], "add_flags": False}

    @asynccontextmanager
    async def lifespan(app):
        # no proxies from the environment, no retries: the relay must be as thin as the loopback it sits on
        client = httpx.AsyncClient(base_url=upstream, timeout=None, trust_env=False)
        client.headers.clear()  # no accept/user-agent/accept-encoding of httpx's own: only what the router sent
        state["client"] = client
        yield
        await state["client"].aclose()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(LOG)
    async def requests_seen(path: str | None = None):
        return {"requests": [r for r in state["requests"] if path is None or r["path"] == path]}

    @app.delete(LOG)
    async def forget():
        state["requests"].clear()
        return {"cleared": True}

    @app.post(MODE)
    async def mode(request: Request):
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("add_flags"), bool):
            return JSONResponse({"error": 'send {"add_flags": true|false}'}, status_code=400)
        state["add_flags"] = body["add_flags"]
        return {"add_flags": state["add_flags"]}

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
    async def relay(path: str, request: Request):
        raw = await request.body()
        route = "/" + path
        # the path and query as the router wrote them, percent-escapes included (not decoded and re-encoded)
        target = request.scope.get("raw_path", route.encode()).decode("latin-1")
        if request.scope.get("query_string"):
            target += "?" + request.scope["query_string"].decode("latin-1")
        if request.method == "POST":
            try:
                recorded: Any = json.loads(raw) if raw else None
            except ValueError:
                recorded = {"_unparsed": raw[:200].decode("utf-8", "replace")}
            state["requests"].append({"method": request.method, "path": route, "body": recorded})
        sent = with_flags(route, raw) if state["add_flags"] and request.method == "POST" else raw
        client: httpx.AsyncClient = state["client"]
        upstream_request = client.build_request(
            request.method,
            target,
            headers=_forwardable(request.headers, HOP_BY_HOP | REQUEST_ONLY),
            content=sent,
        )
        try:
            answer = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": f"tap: upstream {upstream} unreachable: {exc}"}, status_code=502)

        async def body_chunks():
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await answer.aclose()

        response = StreamingResponse(body_chunks(), status_code=answer.status_code)
        # every header line as the engine sent it, repeated ones kept apart (a dict would join them with commas)
        response.raw_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in answer.headers.multi_items()
            if k.lower() not in HOP_BY_HOP
        ]
        return response

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polarstack.bench.tap", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's URL, e.g. http://127.0.0.1:30000")
    args = parser.parse_args(argv)
    import uvicorn

    # no date or server header of the relay's own: the engine's pass through, once
    uvicorn.run(
        build_app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        server_header=False,
        date_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
