"""Sustained concurrent Polar-shaped traffic through the pinned patched router in front of 2 emulated engines
(slime-style POST /workers registration): bounded in count and time, loopback only. No request is lost and
every response keeps its token fields."""

import asyncio
import time

import httpx
import pytest

from polarstack.pins import pin
from polarstack.polar import contract, diagnostics
from polarstack.routers.harness import register_worker

pytestmark = pytest.mark.router
PATCHED = f"{pin('ROUTER_PATCHED_PACKAGE')}=={pin('ROUTER_PATCHED_VERSION')}"
CLIENTS, PER_CLIENT, BUDGET_S = 32, 20, 120


def test_patched_router_under_sustained_load(engine_factory, router_factory):
    engines = [engine_factory(seed=0), engine_factory(seed=1)]
    router = router_factory(PATCHED, [])
    for engine in engines:
        register_worker(router.url, engine.url)
    deadline = time.monotonic() + 15
    while len(httpx.get(f"{router.url}/workers").json()["workers"]) < 2:
        assert time.monotonic() < deadline, "workers never registered"
        time.sleep(0.1)

    async def run() -> list[dict]:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:

            async def client(index: int) -> list[dict]:
                out = []
                for turn in range(PER_CLIENT):
                    body = contract.prepare_request(
                        {
                            "model": "Qwen2.5-7B-Instruct",
                            "max_tokens": 12,
                            "messages": [
                                {"role": "user", "content": f"client {index} request {turn}: write a sorting function"}
                            ],
                        }
                    )
                    reply = await http.post(f"{router.url}/v1/chat/completions", json=body)
                    out.append({"status": reply.status_code, "body": reply.json() if reply.is_success else None})
                return out

            results = await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(CLIENTS))), BUDGET_S)
        return [r for batch in results for r in batch]

    started = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - started
    assert len(results) == CLIENTS * PER_CLIENT
    assert all(r["status"] == 200 for r in results), {r["status"] for r in results}
    verdicts = [diagnostics.diagnose(r["body"]) for r in results]
    assert all(v.trainable_tokens > 0 and not v.problems for v in verdicts)
    assert all({"prompt_token_ids", "meta_info"} <= set(r["body"]["choices"][0]) for r in results)
    answered = [httpx.get(f"{e.url}/_emulator/stats").json()["chat_completions"] for e in engines]
    assert sum(answered) == CLIENTS * PER_CLIENT, answered  # nothing lost, nothing duplicated
    assert all(count > 0 for count in answered)  # both engines served
    print(f"{len(results)} requests in {elapsed:.1f} s through {PATCHED}; per engine {answered}")
