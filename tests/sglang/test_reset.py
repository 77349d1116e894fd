"""Pins what `make demo` resets between profiles on the real engine (issue 27 point 5): sglang's own /flush_cache
empties its radix cache, so a profile's first request finds nothing another profile's traffic left there."""

from pathlib import Path

import httpx

from polarstack.stack import local
from polarstack.stack.profiles import knob


def _cached_tokens(url: str, text: str) -> int:
    body = {
        "model": knob(None, "SERVED_MODEL_NAME"),
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "return_meta_info": True,  # Polar's flag: the answer carries meta_info.cached_tokens
    }
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    return answer["choices"][0]["meta_info"]["cached_tokens"]


def test_reset_empties_the_real_engines_radix_cache(real_engine):
    text = "the same prompt for each profile of the demo, " * 8
    _cached_tokens(real_engine.url, text)
    assert _cached_tokens(real_engine.url, text) > 0  # the second time, the radix cache holds the prompt
    shared = local.LocalState(
        Path("/nonexistent/state.json"),
        {
            "profile": local.SHARED_ENGINES_PROFILE,
            "processes": [],
            "engine": "sglang",
            "engine_urls": [real_engine.url],
        },
    )
    assert local.reset_engines(shared) == []
    assert _cached_tokens(real_engine.url, text) == 0
