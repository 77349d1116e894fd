"""Pins the pre-launch smoke on a router that slime registers engines with (patched-router on Docker): the
smoke registers the engines the router does not list (POST /workers, as slime does), checks the path, then
removes exactly those (DELETE /workers/{id}), so slime's own registration at launch meets no 409."""

import httpx
import pytest

from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.pins import pin

pytestmark = pytest.mark.router
PATCHED = f"{pin('ROUTER_PATCHED_PACKAGE')}=={pin('ROUTER_PATCHED_VERSION')}"


def listed(router_url):
    return sorted(w["url"].rstrip("/") for w in httpx.get(f"{router_url}/workers").json()["workers"])


def test_temporary_registration_leaves_the_router_as_found(engine_factory, router_factory):
    first, second = engine_factory(seed=0), engine_factory(seed=1)
    router = router_factory(PATCHED, [])
    assert listed(router.url) == []
    report = run_smoke(SmokeTarget(router.url, register=[first.url, second.url]), SmokeOptions())
    assert report.ok, report.message
    assert report.trainable_tokens > 0
    assert listed(router.url) == []  # slime can now register both without a 409
    received = len(first.requests()) + len(second.requests())
    assert received == len(report.exchanges)  # the tool-call request (issue 10 point 4) is an exchange too
    assert report.tool_check["tool_calls"] == 2


def test_workers_registered_by_others_stay(engine_factory, router_factory):
    first, second = engine_factory(seed=0), engine_factory(seed=1)
    router = router_factory(PATCHED, [])
    assert httpx.post(f"{router.url}/workers", json={"url": first.url, "worker_type": "regular"}).status_code == 202
    report = run_smoke(SmokeTarget(router.url, register=[first.url, second.url]), SmokeOptions())
    assert report.ok, report.message
    assert listed(router.url) == [first.url]


def test_a_second_job_on_the_same_router_registers_its_engines_again(engine_factory, router_factory):
    """Found by the node-path review of issue 18/19: slime registers external engines at every job's start and never
    removes them, and smg answers a second POST for a listed URL with 409, so a resumed or restarted job, the
    rehearsal's second job or a second `make train` died at engine init. The launch releases them first."""
    from polarstack.routers.worker_api import release_all

    first, second = engine_factory(seed=0), engine_factory(seed=1)
    router = router_factory(PATCHED, [])

    def slime_registers() -> list[int]:  # SGLangEngine._register_to_router for each engine, then raise_for_status
        return [
            httpx.post(f"{router.url}/workers", json={"url": e.url, "worker_type": "regular"}).status_code
            for e in (first, second)
        ]

    assert slime_registers() == [202, 202]  # the first job
    for _ in range(50):
        if len(listed(router.url)) == 2:
            break
        import time

        time.sleep(0.1)
    assert slime_registers() == [409, 409]  # what the next job met before the fix
    assert sorted(release_all(router.url, timeout=10)) == sorted([first.url, second.url])
    assert listed(router.url) == []
    assert slime_registers() == [202, 202]  # the next job starts
