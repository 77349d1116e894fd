"""Where the smoke's chat requests go: the `base` and `polar` routes, as Polar's InferenceClient resolves them.

- `base`: every request goes to the given URL, as older Polar revisions (upstream issue #52) do;
- `polar`: resolve the URL the way current Polar's InferenceClient does (src/polar/gateway/proxy.py,
  `_regular_worker_urls` / `_completion_url`): `GET <base>/workers`; if it lists workers and none is a
  prefill/decode worker, requests go round-robin straight to the regular workers' /v1/chat/completions,
  bypassing the router; otherwise (error, non-2xx, no list) they go to the base URL.
Inside the trainer, where Polar is installed, its own InferenceClient is asked instead (resolve_with_polar).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from dataclasses import dataclass
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.http import request
from polarstack.routers import worker_api


@dataclass
class Resolution:
    route: str  # "base" or "polar"
    base_url: str
    targets: list[str]  # URLs chat requests go to (round-robin)
    bypassed: bool = False  # Polar sends straight to the workers the router lists
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "base_url": self.base_url,
            "targets": self.targets,
            "router_bypassed": self.bypassed,
            "note": self.note,
        }


def v1_url(base: str, endpoint: str) -> str:
    """proxy.py `_v1_endpoint`: do not double `/v1` when the base URL already ends with it."""
    base = base.rstrip("/")
    return f"{base}/{endpoint}" if base.endswith("/v1") else f"{base}/v1/{endpoint}"


def root_url(base: str) -> str:
    """The base URL without a trailing `/v1` (where a router serves /workers)."""
    base = base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def polar_importable() -> bool:
    try:
        return importlib.util.find_spec("polar.gateway.proxy") is not None
    except (ImportError, ValueError):
        return False


def resolve_with_polar(base_url: str, requests: int) -> Resolution:
    """Ask Polar's own InferenceClient where its chat requests go (inside the trainer, where Polar is installed).

    Calls `_completion_url` once per request, as `InferenceClient._completion` does, so round-robin and the
    worker-discovery switch (polarstack.polar.switch) act exactly as in the gateway.
    """
    from polar.gateway.engine import get_engine
    from polar.gateway.proxy import InferenceClient

    async def ask() -> list[str]:
        client = InferenceClient(base_url, get_engine("sglang"))
        try:
            http = await client._get_client()
            return [await client._completion_url(http) for _ in range(max(requests, 1))]
        finally:
            await client.close()

    urls = asyncio.run(ask())
    targets = []
    for url in urls:
        target = url if url.startswith(("http://", "https://")) else base_url
        target = target.split("/v1/", 1)[0].rstrip("/") if "/v1/" in target else target.rstrip("/")
        targets.append(target)
    bypassed = any(t != base_url.rstrip("/") for t in targets)
    ordered = list(dict.fromkeys(targets))
    note = (
        "Polar's own client sends chat requests straight to the worker(s) the router lists, so the router is "
        "bypassed and its cache-aware routing is lost"
        if bypassed
        else "Polar's own client sends every chat request to the base URL"
    )
    return Resolution(
        "polar",
        base_url.rstrip("/"),
        ordered,
        bypassed=bypassed,
        note=note + " (resolved with the installed polar.gateway.proxy)",
    )


def resolve(base_url: str, route: str, http, requests: int = 1) -> Resolution:
    base_url = base_url.rstrip("/")
    if route == "base":
        return Resolution("base", base_url, [base_url], note="every request to the base URL (older Polar revisions)")
    if route != "polar":
        raise StackError(f"--route must be base or polar, not {route!r}.", ExitCode.USAGE)
    if polar_importable():
        return resolve_with_polar(base_url, requests)
    reply = request(http, "GET", f"{root_url(base_url)}{worker_api.PATH}")
    workers = worker_api.parse_list(reply.body) if 200 <= reply.status < 300 else None
    if workers is None:
        return Resolution(
            "polar",
            base_url,
            [base_url],
            note=f"GET /workers answered HTTP {reply.status} without a "
            "worker list, so Polar sends every request to the base URL",
        )
    types = {w.get("worker_type") for w in workers if isinstance(w, dict)}
    if types & {"prefill", "decode"}:
        return Resolution("polar", base_url, [base_url], note="prefill/decode workers listed: Polar keeps the router")
    urls: list[str] = []
    for worker in workers:
        url = worker.get("url") if isinstance(worker, dict) else None
        if (
            isinstance(worker, dict)
            and worker.get("worker_type", "regular") == "regular"
            and isinstance(url, str)
            and url.startswith(("http://", "https://"))
            and url.rstrip("/") not in urls
        ):
            urls.append(url.rstrip("/"))
    if not urls:
        return Resolution(
            "polar", base_url, [base_url], note="the router lists no regular worker: Polar uses the base URL"
        )
    return Resolution(
        "polar",
        base_url,
        urls,
        bypassed=True,
        note=f"the router lists {len(urls)} regular worker(s): Polar sends each chat request straight to "
        "a worker, round-robin, so the router is bypassed and its cache-aware routing is lost",
    )


def discover_model(http, url: str) -> str:
    """The first model id of GET /v1/models, as a researcher's topology would name it; 'default' otherwise."""
    reply = request(http, "GET", v1_url(url, "models"))
    if 200 <= reply.status < 300:
        try:
            data = json.loads(reply.body).get("data")
            if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
                return data[0]["id"]
        except (ValueError, AttributeError):
            pass
    return "default"
