"""The request log: an ASGI middleware recording what reached the engine, for `/_emulator/requests`.

Not sglang (sglang has no such log); the emulator's own, so tests can prove which fields a router passed on.
"""

import json
import time
from typing import Any

from polarstack.engine.emulator.engine import EngineState


class RequestLog:
    """Plain ASGI middleware: record every request (method, path, parsed body, x- headers) before the route runs."""

    def __init__(self, app, state: EngineState) -> None:
        self.app, self.state = app, state

    def _record(self, scope, body: bytes) -> None:
        path = scope.get("path", "")
        if path.startswith("/_emulator/"):
            return
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", [])
            if k.lower().startswith((b"x-", b"content-type"))
        }
        self.state.requests.append(
            {
                "time": time.time(),
                "method": scope.get("method"),
                "path": path,
                "query": scope.get("query_string", b"").decode("latin-1"),
                "body": parsed,
                "headers": headers,
            }
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        done = False

        async def logged_receive():
            nonlocal done
            message = await receive()
            if message["type"] == "http.request" and not done:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True
                    self._record(scope, b"".join(chunks))
            return message

        if scope.get("method") in ("GET", "HEAD", "DELETE"):
            done = True
            self._record(scope, b"")
        self.state.running += 1
        try:
            await self.app(scope, logged_receive, send)
        finally:
            self.state.running -= 1
            self.state.served += 1
            if not done:
                self._record(scope, b"".join(chunks))
