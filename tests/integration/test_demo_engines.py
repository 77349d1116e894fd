"""Pins `make demo`'s shared engines (issue 27 point 5): the engines start once, each profile starts and stops only
its router, and nothing of one profile's traffic reaches the next: every profile's first request on every engine
finds an empty prefix cache, its request log holds only its own requests, its router lists only its own engines.
A profile's `down` leaves the shared engines running; `polarstack down` stops them when a killed demo left them."""

from __future__ import annotations

import time

import httpx
import pytest

from polarstack import processes
from polarstack.checks import demo
from polarstack.errors import ExitCode, StackError
from polarstack.stack import local, profiles

pytestmark = [pytest.mark.emulator, pytest.mark.router]


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    yield tmp_path / "run"
    local.down_all()  # never leave processes behind, even when a test fails ...
    for path in sorted((tmp_path / "run").rglob(local.STATE_FILE)):  # ... wherever a test kept its run state
        local.down(directory=path.parent)


def _ask(url: str, text: str) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).json()


class RecordingDemo(demo.LocalDemo):
    """The local demo, recording what each profile left in the shared engines before the next reset."""

    def __init__(self) -> None:
        super().__init__("emulator", progress=lambda _m: None)
        self.starts = 0
        self.seen: list[tuple[str, dict]] = []
        self.began = 0.0

    def start_engines(self, wanted):
        self.starts += 1
        super().start_engines(wanted)

    def up(self, profile):
        self.began = time.time()
        return super().up(profile)

    def down(self):
        if self.state is not None:
            urls = self.shared.engine_urls
            record = {
                "engine_pids": [p["pid"] for p in self.state.processes if p.get("shared")],
                "served": {u: httpx.get(f"{u}/_emulator/served").json()["served"] for u in urls},
                "logged": {u: httpx.get(f"{u}/_emulator/requests").json()["requests"] for u in urls},
                "began": self.began,
            }
            self.seen.append((self.state.profile, record))
        super().down()


def test_the_demo_starts_engines_once_and_each_profile_finds_a_clean_slate(run_dir):
    runtime = RecordingDemo()
    # the same profile twice sends the same prompts twice: a cache or log that carried over would show
    names = ["patched-router", "engine-direct", "patched-router"]
    rows = demo.run_demo(names, runtime=runtime)
    assert [row["as_expected"] for row in rows] == [True] * 3, rows
    assert runtime.starts == 1 and [name for name, _ in runtime.seen] == names
    pids = runtime.seen[0][1]["engine_pids"]
    assert len(pids) == 2 and runtime.seen[1][1]["engine_pids"] == pids[:1]
    assert runtime.seen[2][1]["engine_pids"] == pids  # the same processes: started once
    for name, record in runtime.seen:
        # each profile's first request on an engine meets an empty prefix cache (the served log's times tell this
        # profile's requests from any an unflushed log kept)
        served = [[e for e in entries if e["time"] >= record["began"]] for entries in record["served"].values()]
        assert any(served), name
        for entries in filter(None, served):
            assert entries[0]["cached_tokens"] == 0, (name, entries[0])
        for url, logged in record["logged"].items():  # and the request log holds this profile's requests only
            assert all(entry["time"] >= record["began"] for entry in logged), (name, url)
    assert not any(processes.start_time(pid) for pid in pids), "the demo left its shared engines running"
    assert not list((run_dir / "demo").glob("*/state.json"))


def test_reset_clears_the_emulators_cache_log_and_fault(run_dir):
    profile = profiles.load("engine-direct")
    shared = local.start_engines(profile, 1, directory=run_dir / "engines")
    url = shared.engine_urls[0]
    _ask(url, "the same prompt, twice over")
    _ask(url, "the same prompt, twice over")
    httpx.post(f"{url}/_emulator/fault", json={"mode": "http500"}).raise_for_status()
    assert httpx.get(f"{url}/_emulator/requests").json()["requests"]
    assert httpx.get(f"{url}/_emulator/stats").json()["cached_tokens"] > 0
    assert local.reset_engines(shared) == []
    assert httpx.get(f"{url}/_emulator/requests").json()["requests"] == []
    assert httpx.get(f"{url}/_emulator/fault").json()["mode"] == "none"
    _ask(url, "the same prompt, twice over")
    assert httpx.get(f"{url}/_emulator/served").json()["served"][0]["cached_tokens"] == 0


def test_a_profile_down_keeps_the_shared_engines_and_polarstack_down_stops_them(run_dir):
    profile = profiles.load("router-passthrough")
    shared = local.start_engines(profile, 2, directory=local.demo_dir() / "engines")
    state = local.up(profile, directory=local.demo_dir() / profile.name, shared=shared, progress=lambda _m: None)
    assert state.engine_urls == shared.engine_urls and state.base_url.startswith("http://127.0.0.1:")
    engine_pids = [p["pid"] for p in shared.processes]
    router_pid = next(p["pid"] for p in state.processes if p["role"] == "router")
    name, stopped = local.down(directory=local.demo_dir() / profile.name)
    assert (name, stopped) == (profile.name, [router_pid])
    assert all(processes.start_time(pid) for pid in engine_pids), "a profile's down stopped a shared engine"
    # as a killed demo leaves them: `polarstack down` finds and stops the shared engines
    assert local.down_all() == [(local.SHARED_ENGINES_PROFILE, engine_pids[::-1])]
    assert not any(processes.start_time(pid) for pid in engine_pids)


def test_a_stale_registration_on_the_router_is_found(run_dir, engine_factory):
    profile = profiles.load("patched-router")
    shared = local.start_engines(profile, 2, directory=run_dir / "engines")
    state = local.up(profile, directory=run_dir / "profile", shared=shared, progress=lambda _m: None)
    assert local.stale_registrations(state, profile) == []
    stranger = engine_factory(seed=7)  # an engine another profile registered, had the router survived it
    router = next(p["url"] for p in state.processes if p["role"] == "router")
    assert httpx.post(f"{router}/workers", json={"url": stranger.url, "worker_type": "regular"}).status_code == 202
    for _ in range(50):
        if local.stale_registrations(state, profile):
            break
        time.sleep(0.1)
    assert local.stale_registrations(state, profile) == [stranger.url]


def test_shared_engines_refuse_a_profile_they_do_not_fit(run_dir):
    one = local.start_engines(profiles.load("engine-direct"), 1, directory=run_dir / "engines")
    with pytest.raises(StackError) as raised:
        local.up(profiles.load("patched-router"), directory=run_dir / "p", shared=one, progress=lambda _m: None)
    assert raised.value.code == ExitCode.USAGE and "needs 2 engines" in raised.value.message
    with pytest.raises(StackError) as raised:  # other engine flags than the shared engines were started with
        local.up(
            profiles.load("engine-direct"),
            directory=run_dir / "q",
            shared=one,
            engine_args=["--prefill-us-per-token", "5"],
            progress=lambda _m: None,
        )
    assert raised.value.code == ExitCode.USAGE and "another command line" in raised.value.message
    assert not (run_dir / "p" / local.STATE_FILE).exists() and all(
        processes.start_time(p["pid"]) for p in one.processes
    )


class _DirtyRuntime:
    """A runtime whose reset cannot clear everything: the profile must not run on it."""

    def __init__(self) -> None:
        self.ups = 0

    def start_engines(self, wanted):
        pass

    def reset(self):
        return ["3 request(s) in http://127.0.0.1:1's request log"]

    def up(self, profile):
        self.ups += 1
        raise AssertionError("a profile was brought up on a dirty slate")

    def down(self):
        pass

    def stop_engines(self):
        pass


@pytest.mark.unit
def test_a_profile_never_runs_on_what_the_previous_one_left():
    runtime = _DirtyRuntime()
    rows = demo.run_demo(["engine-direct"], runtime=runtime)
    assert runtime.ups == 0
    assert rows[0]["verdict"] == "ERROR" and not rows[0]["as_expected"]
    assert "state carried over from the previous profile: 3 request(s)" in rows[0]["message"]
