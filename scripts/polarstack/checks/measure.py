"""Measurement helpers shared by `probe`, `routers matrix` and `bench`: issue #52's request body, the engine-log flag
check, the /generate check, interleaved latency, percentiles and the machine description."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from polarstack.polar.contract import POLAR_REQUEST_FLAGS

# Upstream issue #52's probe body (model filled in at run time): Polar's two return_* flags on a chat request.
ISSUE_52_BODY = {
    "messages": [{"role": "user", "content": "Say hi in 5 words"}],
    "max_tokens": 12,
    "logprobs": True,
    "top_logprobs": 0,
    "return_prompt_token_ids": True,
    "return_meta_info": True,
}

# The engine emulator's own request log (polarstack emulate-engine): what reached the engine, body included.
ENGINE_LOG = "/_emulator/requests"


# --- did Polar's flags reach the engine? -------------------------------------------------------------------


def carries_polar_flags(body: dict[str, Any]) -> bool:
    """Does a chat/completions request body carry both of Polar's return_* flags, set to true?"""
    return all(body.get(flag) is True for flag in POLAR_REQUEST_FLAGS)


def engine_saw_flags(entries: list[Any]) -> bool | None:
    """From the engine log's entries: did the last request carry both flags? None if there is no usable entry."""
    if not entries or not isinstance(entries[-1], dict) or not isinstance(entries[-1].get("body"), dict):
        return None
    return carries_polar_flags(entries[-1]["body"])


# --- does /generate keep its tokens? -----------------------------------------------------------------------


def generate_body(text: str, *, temperature: float | None = None) -> dict[str, Any]:
    """A native /generate request asking for logprobs: its meta_info is a response-only field no router release
    rewrites (router-behavior.md)."""
    sampling: dict[str, Any] = {"max_new_tokens": 4}
    if temperature is not None:
        sampling["temperature"] = temperature
    return {"text": text, "sampling_params": sampling, "return_logprob": True}


def generate_keeps_tokens(parsed: Any) -> bool | None:
    """Does a parsed /generate answer (an object, or a list whose first item is one) still hold output_ids and
    meta_info.output_token_logprobs? None when it is not such an answer."""
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]
    if not isinstance(parsed, dict):
        return None
    meta = parsed.get("meta_info")
    return bool(parsed.get("output_ids")) and isinstance(meta, dict) and bool(meta.get("output_token_logprobs"))


# --- latency -------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def interleaved_latency(
    http: httpx.Client, direct: str, via: str, count: int, body: Callable[[int], dict[str, Any]]
) -> tuple[list[float], list[float]]:
    """`count` chat requests each way (request i carries `body(i)`), interleaved so drift hits both sides equally;
    the milliseconds of the successful ones, (direct, via)."""
    times: dict[str, list[float]] = {"direct": [], "via": []}
    for i in range(count):
        for side, base in (("direct", direct), ("via", via)):
            started = time.perf_counter()
            reply = http.post(f"{base}/v1/chat/completions", json=body(i))
            elapsed = (time.perf_counter() - started) * 1000
            if reply.is_success:
                times[side].append(elapsed)
    return times["direct"], times["via"]


def latency_summary(direct: list[float], via: list[float]) -> dict[str, float]:
    """Medians and p99s of both sides and what the path through `via` adds (via minus direct), in milliseconds."""
    return {
        "direct_median_ms": statistics.median(direct),
        "via_median_ms": statistics.median(via),
        "direct_p99_ms": percentile(direct, 0.99),
        "via_p99_ms": percentile(via, 0.99),
        "added_median_ms": statistics.median(via) - statistics.median(direct),
        "added_p99_ms": percentile(via, 0.99) - percentile(direct, 0.99),
    }


# --- where it ran ----------------------------------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
        f"CPython {platform.python_version()}, no GPU"
    )
