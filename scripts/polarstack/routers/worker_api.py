"""The router worker API, spoken once: register (POST /workers), list (GET /workers), deregister, wait listed/gone.

It is the API slime registers its engines through (slime/backends/sglang_utils/sglang_engine.py at SLIME_COMMIT:
`SGLangEngine._register_to_router` posts {"url", "worker_type"}; `SGLangEngine.shutdown` lists GET /workers and
removes its own entry with DELETE /workers/{id}) and the list current Polar discovers workers from (the smoke's
`resolve`). Which releases offer it is the catalog's `RouterRelease.has_worker_api`. Registration and removal are
asynchronous (the routers answer 202), so callers wait until GET /workers shows the change.

Used by `local.up` (register the engines of a slime-registered profile), the smoke (`registered`: temporary
registration around a pre-launch smoke), the routers matrix (the pure parts, over its own measuring client) and
`routers.register_worker` (re-exported for existing imports).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable, Iterator

import httpx

from polarstack.errors import ExitCode, StackError
from polarstack.http import Reply, client, request

PATH = "/workers"
POLL_SECONDS = 0.1


# --- the API's shapes (pure) ------------------------------------------------------------------------------


def registration(worker_url: str) -> dict[str, str]:
    """The POST /workers body slime sends for a regular engine (`SGLangEngine._register_to_router`)."""
    return {"url": worker_url, "worker_type": "regular"}


def parse_list(body: bytes) -> list[Any] | None:
    """The `workers` list of a GET /workers answer body; None when the body is not a JSON object holding a list."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    workers = payload.get("workers") if isinstance(payload, dict) else None
    return workers if isinstance(workers, list) else None


def by_url(workers: list[Any], *, healthy_only: bool = False) -> dict[str, str]:
    """URL (without a trailing slash) -> worker id of the listed workers; with `healthy_only`, only those the
    router does not mark `is_healthy: false`."""
    out: dict[str, str] = {}
    for worker in workers:
        if not isinstance(worker, dict) or not isinstance(worker.get("url", ""), str):
            continue
        if healthy_only and not worker.get("is_healthy", True):
            continue
        out[worker.get("url", "").rstrip("/")] = worker.get("id", "")
    return out


def poll_until(check: Callable[[], bool], timeout: float, interval: float = POLL_SECONDS) -> bool:
    """Call `check` every `interval` seconds until it is true (True) or `timeout` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# --- calls through the stack's HTTP client (failures are StackErrors) -------------------------------------------


def post(router_url: str, worker_url: str, timeout: float = 10.0) -> Reply:
    """POST /workers for `worker_url` on a client of its own, closed afterwards, within `timeout` s in total."""
    with client(timeout) as http:
        return request(http, "POST", f"{router_url}{PATH}", registration(worker_url))


def register(router_url: str, worker_url: str, timeout: float = 10.0) -> None:
    """Register an engine the way slime does: POST /workers {"url", "worker_type": "regular"} (within `timeout`
    seconds in total: the training gate registers engines through here)."""
    try:
        reply = post(router_url, worker_url, timeout)
    except StackError as exc:
        raise StackError(
            f"could not register {worker_url} with the router at {router_url}: {exc.message}", exc.code
        ) from None
    if not 200 <= reply.status < 300:
        raise StackError(
            f"the router at {router_url} refused POST /workers for {worker_url} "
            f"(HTTP {reply.status}: {reply.body[:200].decode('utf-8', 'replace')}); it has no "
            "slime-compatible worker API.",
            ExitCode.HTTP_ERROR,
        )


def list_workers(http: httpx.Client, router_url: str, *, healthy_only: bool = False) -> dict[str, str]:
    """GET /workers as URL -> worker id; empty when the answer is not a 2xx worker list."""
    reply = request(http, "GET", f"{router_url}{PATH}")
    workers = parse_list(reply.body) if 200 <= reply.status < 300 else None
    return by_url(workers or [], healthy_only=healthy_only)


def deregister(http: httpx.Client, router_url: str, worker_id: str) -> Reply:
    """DELETE /workers/{id}, slime's own removal call (`SGLangEngine.shutdown`)."""
    return request(http, "DELETE", f"{router_url}{PATH}/{worker_id}")


def _wait(
    http: httpx.Client,
    router_url: str,
    timeout: float,
    settled: Callable[[set[str]], bool],
    *,
    healthy_only: bool = False,
    tolerate_errors: bool = False,
) -> set[str]:
    """Poll GET /workers until `settled(listed URLs)` or `timeout` s pass; the URLs of the last answer read."""
    seen: set[str] = set()

    def check() -> bool:
        nonlocal seen
        try:
            seen = set(list_workers(http, router_url, healthy_only=healthy_only))
        except StackError:
            if not tolerate_errors:
                raise
        return settled(seen)

    poll_until(check, timeout)
    return seen


def wait_listed(
    http: httpx.Client,
    router_url: str,
    urls: list[str],
    timeout: float,
    *,
    healthy_only: bool = False,
    tolerate_errors: bool = False,
) -> set[str]:
    """Poll GET /workers until it lists every one of `urls` or `timeout` s pass; returns the ones still missing
    (per the last answer read). With `tolerate_errors`, a failed poll is retried instead of raised."""
    if not urls:
        return set()
    return set(urls) - _wait(
        http,
        router_url,
        timeout,
        lambda seen: set(urls) <= seen,
        healthy_only=healthy_only,
        tolerate_errors=tolerate_errors,
    )


def wait_gone(http: httpx.Client, router_url: str, urls: list[str], timeout: float) -> set[str]:
    """Poll GET /workers until it lists none of `urls` or `timeout` s pass; returns the ones still listed."""
    if not urls:
        return set()
    return set(urls) & _wait(http, router_url, timeout, lambda seen: not set(urls) & seen)


# --- what the stack does with it ---------------------------------------------------------------------------


def release_all(router_url: str, timeout: float) -> list[str]:
    """Before slime registers the engines at a job's start: remove every worker the router lists and wait until
    it lists none. slime registers external engines (`SGLangEngine._register_to_router`, POST /workers, then
    raise_for_status) but never removes them (`shutdown` returns early when `rollout_external`, sglang_engine.py
    at SLIME_COMMIT), and smg answers a second POST for a listed URL with 409 WORKER_ALREADY_EXISTS: without this a
    resumed, restarted or second job dies at engine init. Returns the URLs removed."""
    with client(timeout) as http:
        listed = list_workers(http, router_url)
        for worker_id in listed.values():
            if worker_id:
                deregister(http, router_url, worker_id)
        if wait_gone(http, router_url, list(listed), max(timeout, 10)):
            raise StackError(
                f"the router at {router_url} still lists {sorted(listed)} after DELETE /workers; slime's "
                "registration of the engines would meet a 409, so the job was not started.",
                ExitCode.HTTP_ERROR,
            )
    return sorted(listed)


def register_all(router_url: str, worker_urls: list[str], timeout: float) -> None:
    """`local.up` for a slime-registered profile: register every engine, then wait until GET /workers lists each
    one as healthy (slime's registration is asynchronous, 202), polling with 2 s per request."""
    for url in worker_urls:
        register(router_url, url)
    with client(2) as http:
        missing = wait_listed(http, router_url, worker_urls, timeout, healthy_only=True, tolerate_errors=True)
    if missing:
        raise StackError(
            f"the router at {router_url} did not list {sorted(missing)} as healthy "
            f"workers within {timeout:g} s after POST /workers.",
            ExitCode.ENVIRONMENT,
        )


@contextlib.contextmanager
def registered(router_url: str, engine_urls: list[str], timeout: float) -> Iterator[list[str]]:
    """Register engines the router does not list yet, as slime does (POST /workers), for the duration of a
    smoke; afterwards remove exactly those (DELETE /workers/{id}, slime's own removal call), so slime's
    registration at launch does not meet a 409 for an existing worker."""
    added: list[str] = []
    with client(timeout) as http:
        listed = list_workers(http, router_url)
        for url in engine_urls:
            if url not in listed:
                register(router_url, url, timeout)
                added.append(url)
        if wait_listed(http, router_url, added, max(timeout, 10)):
            raise StackError(
                f"the router at {router_url} did not list {added} after POST /workers.", ExitCode.HTTP_ERROR
            )
    try:
        yield added
    finally:
        with client(timeout) as http:
            for url, worker_id in list_workers(http, router_url).items():
                if url in added and worker_id:
                    deregister(http, router_url, worker_id)
            # Removal is asynchronous too (smg answers 202): wait until the router no longer lists them.
            if wait_gone(http, router_url, added, max(timeout, 10)):
                raise StackError(
                    f"the router at {router_url} still lists {added} after DELETE /workers; remove "
                    "them before launching, or slime's registration will meet a 409.",
                    ExitCode.HTTP_ERROR,
                )
