"""HTTP calls with the stack's error vocabulary: every transport failure becomes a StackError."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx

from polarstack.errors import ExitCode, StackError

CONNECT_TIMEOUT = 3.0


def client(timeout: float) -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
                        follow_redirects=False, trust_env=False)


@dataclass
class Reply:
    url: str
    status: int
    body: bytes
    elapsed: float
    content_type: str

    def json(self) -> Any:
        """The parsed JSON body; MALFORMED StackError when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            snippet = self.body[:80].decode("utf-8", "replace").replace("\n", " ")
            raise StackError(f"{self.url} answered HTTP {self.status} with a body that is not JSON "
                             f"({self.content_type or 'no content type'}, starts {snippet!r}); check what listens there.",
                             ExitCode.MALFORMED) from None


def error_message(body: bytes) -> str:
    """The human message inside an error body (OpenAI, sglang ErrorResponse or plain text)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:160] if text else "empty body"
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:300]
        if isinstance(parsed.get("message"), str):
            return parsed["message"][:300]
    return json.dumps(parsed)[:160]


def request(http: httpx.Client, method: str, url: str, payload: Any = None) -> Reply:
    """Send one request; raise UNREACHABLE on connection errors and timeouts. Any status is returned."""
    started = time.perf_counter()
    try:
        if payload is None:
            response = http.request(method, url)
        else:
            response = http.request(method, url, content=json.dumps(payload),
                                    headers={"Content-Type": "application/json"})
    except httpx.TimeoutException:
        raise StackError(f"{url} did not answer within {http.timeout.read:g} s; the engine may be overloaded or "
                         "hung (raise --timeout only if it is merely slow).", ExitCode.UNREACHABLE) from None
    except httpx.ConnectError:
        raise StackError(f"nothing accepts connections at {url}; start the engine or router "
                         "(`make up`), or fix --base-url.", ExitCode.UNREACHABLE) from None
    except httpx.HTTPError as exc:
        raise StackError(f"the connection to {url} failed ({type(exc).__name__}: {exc}); check that the "
                         "server is up and speaks HTTP.", ExitCode.UNREACHABLE) from None
    return Reply(url, response.status_code, response.content, time.perf_counter() - started,
                 response.headers.get("content-type", ""))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
