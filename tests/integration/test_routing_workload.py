"""Pins the agent-shaped workload end to end at small scale (2 emulated engines, 8 sessions, 3 turns): the turns
are recovered from the engines' served logs whatever routes them, and the metrics of docs/routing.md come out
as designed: straight session-sticky placement reaches the ideal cache share exactly, Polar's per-request
round-robin bypass splits requests evenly and loses cache, and the routing flags the profiles ship
(ROUTER_ARGS) behave as docs/routing.md reports through the real pinned routers."""

import asyncio

import httpx
import pytest

from conftest import START_SECONDS
from polarstack.bench import workload as w
from polarstack.bench.routing import bypass_picker
from polarstack.processes import startup_seconds, stop_pid
from polarstack.routers.harness import start as start_router
from polarstack.stack import profiles
from polarstack.stack.engines import stack_parser, start_emulator

SMALL = w.AgentWorkload(sessions=8, turns=3, think_seconds=(0.0, 0.02))
MODEL = "Qwen2.5-7B-Instruct"


@pytest.fixture(scope="module")
def engines():
    parser = stack_parser(profiles.stack_settings())  # the stack's, as the engines run it
    started = [
        start_emulator(seed=i, timeout=startup_seconds(START_SECONDS), tool_call_parser=parser) for i in range(2)
    ]
    try:
        yield [f"http://127.0.0.1:{port}" for _, port in started]
    finally:
        for process, _ in started:
            stop_pid(process.pid, process)


def _run(engines, pick, **kwargs):
    for url in engines:
        httpx.post(f"{url}/flush_cache", timeout=30).raise_for_status()
    result = asyncio.run(w.run_sessions(SMALL, pick, MODEL, **kwargs))
    assert result.failures == 0, result.first_error
    assert result.turns_ok == SMALL.sessions * SMALL.turns
    m = w.metrics(w.collect(engines), len(engines))
    assert m["turns"] == SMALL.sessions * SMALL.turns and m["sessions"] == SMALL.sessions
    assert sum(m["requests_per_engine"]) == m["turns"]
    assert m["shared_prefix_tokens"] > w.SYSTEM_PROMPT_TOKENS + w.TOOL_SCHEMA_TOKENS * 0.9
    return m


@pytest.mark.emulator
def test_sticky_sessions_reach_the_ideal_and_bypass_does_not(engines):
    sticky = _run(engines, lambda s: engines[s % 2])
    assert sticky["session_affinity"] == 1.0
    assert sticky["cached_tokens"] == sticky["ideal_cached_tokens"] and sticky["cache_vs_ideal"] == 1.0
    assert sticky["request_share"] == [0.5, 0.5]
    decisions: dict[int, list[str]] = {}
    bypass_pick = bypass_picker(engines)

    def recorded(session: int) -> str:  # each session's turns are sequential, so its list is in turn order
        url = bypass_pick(session)
        decisions.setdefault(session, []).append(url)
        return url

    bypass = _run(engines, recorded)
    assert bypass["requests_per_engine"] == [12, 12]  # one shared counter, the next worker per request
    # Which engine a turn gets depends on how the sessions interleave, so the expected affinity is computed from
    # the picker's own decisions, and the engines' served logs must show exactly those decisions.
    assert bypass["session_affinity"] == pytest.approx(decision_affinity(decisions))
    if decision_affinity(decisions) < 1.0:
        assert bypass["cache_vs_ideal"] < 1.0  # a session that changed engine lost its prefix there


def decision_affinity(decisions: dict[int, list[str]]) -> float:
    follow = [urls[t] == urls[t - 1] for urls in decisions.values() for t in range(1, len(urls))]
    return sum(follow) / len(follow)


@pytest.mark.parametrize("sessions, affinity", [(3, 0.0), (8, 1.0)])
def test_bypass_affinity_depends_only_on_how_sessions_interleave(sessions, affinity):
    """Polar's bypass in lockstep (every session's turn t before any turn t+1): with an odd number of sessions the
    shared counter moves every session to the other engine each turn; with an even number it happens to keep them."""
    pick = bypass_picker(["http://a", "http://b"])
    decisions: dict[int, list[str]] = {}
    for _turn in range(3):
        for session in range(sessions):
            decisions.setdefault(session, []).append(pick(session))
    assert decision_affinity(decisions) == affinity


@pytest.mark.router
def test_router_passthrough_shipped_round_robin_balances_but_cannot_keep_sessions(engines):
    profile = profiles.load("router-passthrough")
    assert profile.router_args == ["--policy", "round_robin"]
    router = start_router(
        profile.router, engines, extra_args=profile.router_args, timeout=startup_seconds(START_SECONDS)
    )
    try:
        m = _run(engines, lambda s: router.url)
    finally:
        router.stop()
    assert m["requests_per_engine"] == [12, 12]
    assert m["session_affinity"] < 0.95  # the documented limit of sglang-router 0.1.4


@pytest.mark.router
def test_patched_router_shipped_cache_aware_keeps_sessions_on_their_engine(engines):
    profile = profiles.load("patched-router")
    assert "--policy" in profile.router_args and "cache_aware" in profile.router_args
    router = start_router(
        profile.router, engines, extra_args=profile.router_args, timeout=startup_seconds(START_SECONDS)
    )
    try:
        m = _run(engines, lambda s: router.url)
    finally:
        router.stop()
    assert m["session_affinity"] >= 0.95 and m["cache_vs_ideal"] >= 0.95
    # Balance is not asserted at this scale: with 8 sessions the spill gate rarely opens (docs/routing.md).


@pytest.mark.router
def test_local_runtime_launches_the_profile_router_args_and_engine_service_time(tmp_path, monkeypatch, capsys):
    import json

    from polarstack.cli.main import main
    from polarstack.stack import local

    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    try:
        assert main(["up", "--profile", "patched-router", "--prefill-us-per-token", "100", "--json"]) == 0
        state = json.loads(capsys.readouterr().out)
    finally:
        local.down(directory=tmp_path / "run")
    by_role = {p["role"]: p["cmd"] for p in state["processes"]}
    router_args = profiles.load("patched-router").router_args
    assert by_role["router"][-len(router_args) :] == router_args
    for role in ("engine-0", "engine-1"):
        assert by_role[role][-2:] == ["--prefill-us-per-token", "100.0"]


@pytest.mark.router
def test_recorded_routing_facts_are_current_and_match_the_catalog():
    """configs/upstream/routing-facts.json is what the pinned releases say now (scripts/tools/record_routing_facts.py),
    and the router catalog's policies and the bench's default-policy label agree with it."""
    import json
    import subprocess
    import sys

    from polarstack.bench.routing import DEFAULT_POLICY
    from polarstack.pins import repo_root
    from polarstack.routers.catalog import RouterRelease

    root = repo_root()
    fresh = subprocess.run(
        [sys.executable, str(root / "scripts/tools/record_routing_facts.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
    )
    recorded = json.loads((root / "configs/upstream/routing-facts.json").read_text())
    assert json.loads(fresh.stdout) == recorded
    for router in recorded["routers"]:
        assert RouterRelease.parse(router["spec"]).policies == tuple(router["policies"])
        assert router["defaults"]["policy"] == DEFAULT_POLICY
    assert set(recorded["sglang"]["metrics"]) == {
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:cache_hit_rate",
    }


@pytest.mark.unit
def test_verify_offline_flags_router_args_nobody_measured(monkeypatch):
    from polarstack.offline.verify import check_routing_measurement

    assert check_routing_measurement(profiles.load("patched-router")).ok
    monkeypatch.setenv("ROUTER_ARGS", "--policy random")
    check = check_routing_measurement(profiles.load("patched-router"))
    assert not check.ok and "rerun `polarstack bench --routing`" in check.problems[0]
    assert not check_routing_measurement(profiles.load("patched-router"), {"profiles": {}}).ok
