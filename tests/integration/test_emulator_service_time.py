"""Pins the emulator's agent-workload features: the served log (`/_emulator/served`: token counts and the tag of
each chat completion, cleared by /flush_cache) and the service-time model of `emulate-engine
--prefill-us-per-token/--decode-us-per-token` (off by default; uncached prompt tokens are prefilled one request
at a time per engine, so a cache hit is served faster and concurrent misses queue)."""

import time

import httpx
import pytest

from polarstack.polar import contract

pytestmark = pytest.mark.emulator


def _body(text: str, words: int = 0) -> dict:
    content = text + (" " + " ".join(["alpha"] * words) if words else "")
    return contract.prepare_request(
        {"model": "Qwen2.5-7B-Instruct", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    )


def _post(url: str, body: dict) -> float:
    started = time.perf_counter()
    httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
    return time.perf_counter() - started


def test_served_log_tags_counts_and_flush(engine_factory):
    engine = engine_factory()
    httpx.post(f"{engine.url}/flush_cache")
    _post(engine.url, _body("s3.t0 task: fix it", 40))
    _post(engine.url, _body("s3.t0 task: fix it", 40))
    served = httpx.get(f"{engine.url}/_emulator/served").json()["served"]
    assert [s["tag"][:6] for s in served] == ["s3.t0 ", "s3.t0 "]
    assert served[0]["cached_tokens"] == 0 and served[1]["cached_tokens"] == served[1]["prompt_tokens"] - 1
    assert all(s["completion_tokens"] > 0 for s in served)
    assert httpx.get(f"{engine.url}/_emulator/served", params={"since": 1}).json()["served"] == served[1:]
    httpx.post(f"{engine.url}/flush_cache")
    assert httpx.get(f"{engine.url}/_emulator/served").json()["served"] == []


def test_service_time_is_off_by_default(engine):
    _post(engine.url, _body("service time off", 2000))
    served = httpx.get(f"{engine.url}/_emulator/served").json()["served"]
    assert served[-1]["service_seconds"] == 0.0


def test_prefill_time_follows_uncached_tokens_and_queues(engine_factory):
    # 400 us per uncached token: a ~2000-token miss costs ~0.8 s of prefill, the same prompt again ~0.
    engine = engine_factory(engine_args=["--prefill-us-per-token", "400"])
    miss = _post(engine.url, _body("first", 2000))
    _post(engine.url, _body("first", 2000))
    first, again = httpx.get(f"{engine.url}/_emulator/served").json()["served"]
    assert first["service_seconds"] == pytest.approx(first["prompt_tokens"] * 400e-6, rel=0.01)
    assert again["service_seconds"] == pytest.approx(400e-6, abs=1e-3)  # one token recomputed
    assert miss >= first["service_seconds"]


def test_prefill_queues_one_request_at_a_time():
    from polarstack.engine.emulator.engine import EngineState, service_time

    state = EngineState(model="m", seed=0, prefill_us_per_token=1000, decode_us_per_token=10)
    first = service_time(state, 500, 4)  # 0.5 s prefill + 40 us decode
    second = service_time(state, 500, 4)  # waits for the first prefill, then its own
    assert first == pytest.approx(0.50004, abs=0.01) and second == pytest.approx(1.00004, abs=0.01)
    assert service_time(EngineState(model="m", seed=0), 10**6, 10**6) == 0.0  # off by default


def test_decode_time_follows_generated_tokens(engine_factory):
    engine = engine_factory(engine_args=["--decode-us-per-token", "100000"])  # 0.1 s per generated token
    started = time.perf_counter()
    reply = httpx.post(f"{engine.url}/v1/chat/completions", json=_body("y"), timeout=30).json()
    assert time.perf_counter() - started >= 0.1 * reply["usage"]["completion_tokens"]


def test_service_time_flags_are_validated(capsys):
    from polarstack.cli.main import main
    from polarstack.errors import ExitCode

    assert main(["emulate-engine", "--port", "1", "--prefill-us-per-token", "-1"]) == ExitCode.USAGE
    assert "--prefill-us-per-token must be between 0 and 1e6" in capsys.readouterr().err
