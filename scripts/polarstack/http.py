"""HTTP calls with the stack's error vocabulary: every transport failure becomes a StackError.

Every request made through `request()` on a `client()` has a TOTAL deadline (the client's timeout), not only
httpx's per-read one: a server that drips one byte every half second would otherwise keep a `--timeout 3`
smoke running forever. The deadline is enforced in the network stream itself (each connect, read and write
gets at most the time left), so it also bounds a reply whose status line or headers arrive byte by byte.
"""

from __future__ import annotations

import contextvars
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from polarstack.errors import ExitCode, StackError

CONNECT_TIMEOUT = 3.0

# The monotonic time by which the request in flight (in this thread/context) must be complete; None: no limit.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("polarstack_http_deadline", default=None)


def _budget(timeout: float | None, exc: type[Exception]) -> float | None:
    """The per-operation timeout, shortened to what is left of the request's total deadline."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, _budget(timeout, httpcore.ConnectTimeout))
        )

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _DeadlineStream(
            self._backend.connect_tcp(
                host, port, _budget(timeout, httpcore.ConnectTimeout), local_address, socket_options
            )
        )

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(
            self._backend.connect_unix_socket(path, _budget(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        # httpx builds its pool without a way to pass a network backend; rebuild it with ours (same defaults).
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), network_backend=_DeadlineBackend())


def client(timeout: float) -> httpx.Client:
    """An HTTP client whose `request()` calls each end within `timeout` seconds in total."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
        follow_redirects=False,
        trust_env=False,
        transport=_DeadlineTransport(),
    )


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
            raise StackError(
                f"{self.url} answered HTTP {self.status} with a body that is not JSON "
                f"({self.content_type or 'no content type'}, starts {snippet!r}); check what listens there.",
                ExitCode.MALFORMED,
            ) from None


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
    """Send one request; raise UNREACHABLE on connection errors and timeouts (the client's read timeout is the
    request's total deadline, body included). Any status is returned."""
    started = time.perf_counter()
    total = http.timeout.read
    token = _DEADLINE.set(time.monotonic() + total if total is not None else None)
    try:
        if payload is None:
            response = http.request(method, url)
        else:
            response = http.request(
                method, url, content=json.dumps(payload), headers={"Content-Type": "application/json"}
            )
    except httpx.TimeoutException:
        raise StackError(
            f"{url} did not answer within {total:g} s in total; the engine may be overloaded or "
            "hung (raise --timeout only if it is merely slow).",
            ExitCode.UNREACHABLE,
        ) from None
    except httpx.ConnectError:
        raise StackError(
            f"nothing accepts connections at {url}; start the engine or router (`make up`), or fix --base-url.",
            ExitCode.UNREACHABLE,
        ) from None
    except httpx.HTTPError as exc:
        raise StackError(
            f"the connection to {url} failed ({type(exc).__name__}: {exc}); check that the "
            "server is up and speaks HTTP.",
            ExitCode.UNREACHABLE,
        ) from None
    finally:
        _DEADLINE.reset(token)
    depth = json_depth(response.content)
    if depth > MAX_JSON_DEPTH:
        # json.loads would die with RecursionError (an internal error) wherever the body is parsed.
        raise StackError(
            f"{url} answered HTTP {response.status_code} with JSON nested {depth} levels deep (an API "
            f"answer nests fewer than {MAX_JSON_DEPTH}); check what listens there.",
            ExitCode.MALFORMED,
        )
    return Reply(
        url,
        response.status_code,
        response.content,
        time.perf_counter() - started,
        response.headers.get("content-type", ""),
    )


MAX_JSON_DEPTH = 100
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays/objects in a JSON-looking body (0 for anything else)."""
    if body.lstrip()[:1] not in (b"{", b"["):
        return 0
    depth = deepest = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', body)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest
