"""`make bench` / `polarstack bench`: every profile on the local runtime, measured side by side in one run.

Per profile and repetition: the smoke's verdict time; latency of Polar-shaped chat requests through the
profile's base URL and straight to engine-0 (interleaved, so the difference is the router's hop); throughput
at several concurrencies; trainable-token yield (token ids Polar can extract / tokens the engines generated).
For profiles with 2+ engines, the share of prompt tokens served from the engines' prefix caches over many
concurrent multi-turn sessions, for: the router's default policy, the same router with round_robin, and
Polar's own worker bypass (round-robin per request, src/polar/gateway/proxy.py).

What a CPU emulator can say: the cost of the HTTP path (router hop, (de)serialization, connection handling)
and where requests land (routing, cache affinity, field loss). What it cannot: GPU batching, prefill/decode
speed, KV-cache capacity or eviction under memory pressure; its throughput is the emulator's, not sglang's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from polarstack.checks import measure, tool_exchange
from polarstack.checks.measure import machine
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.polar import contract, diagnostics
from polarstack.routers.harness import start as start_router
from polarstack.stack import local, profiles

CPU_NOTE = (
    "Measured with CPU stand-ins for the engines (`polarstack emulate-engine`) and the real router "
    "binaries on 127.0.0.1. These figures show the cost of the HTTP path (the router's hop, "
    "serialization, connection handling) and where requests land (routing, prefix-cache affinity, "
    "field loss). They say nothing about GPU batching, prefill/decode speed or KV-cache capacity: "
    "throughput here is the emulator's, not sglang's, and a GPU engine's per-request time (tens to "
    "thousands of milliseconds) dwarfs a sub-millisecond hop."
)


def spread(summary: dict[str, float], digits: int = 3) -> str:
    """The table cell shared with the CLI table: a measured median with its range over repetitions: `median (min-max)`."""
    return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"


def _body(model: str, text: str, max_tokens: int = 16) -> dict[str, Any]:
    return contract.prepare_request(
        {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    )


def _model(url: str) -> str:
    try:
        return httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return "default"


def latency(base: str, direct: str, model: str, count: int) -> dict[str, float]:
    with httpx.Client(timeout=30, trust_env=False) as http:
        d, v = measure.interleaved_latency(http, direct, base, count, lambda i: _body(model, f"ping {i % 7}", 1))
    return {**measure.latency_summary(d, v), "ok": len(v), "sent": count}


async def _throughput(base: str, model: str, concurrency: int, total: int) -> dict[str, float]:
    semaphore = asyncio.Semaphore(concurrency)
    extracted = generated = failures = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as http:

        async def one(i: int) -> None:
            nonlocal extracted, generated, failures
            async with semaphore:
                reply = await http.post(f"{base}/v1/chat/completions", json=_body(model, f"task {i}"))
            if not reply.is_success:
                failures += 1
                return
            body = reply.json()
            generated += int(body.get("usage", {}).get("completion_tokens", 0))
            extracted += diagnostics.diagnose(body).trainable_tokens

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(total)))
        elapsed = time.perf_counter() - started
    return {
        "requests_per_s": total / elapsed,
        "failures": failures,
        "token_yield": extracted / generated if generated else 0.0,
    }


async def _sessions(targets: Callable[[], str], model: str, sessions: int, turns: int) -> int:
    """Concurrent multi-turn sessions; `targets()` picks the URL of each request. Returns failures."""
    failures = 0
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:

        async def session(index: int) -> None:
            nonlocal failures
            messages = [
                {"role": "system", "content": f"You are agent {index}. " + "Work carefully. " * 20},
                {"role": "user", "content": f"Session {index}: fix the failing test in module_{index}.py"},
            ]
            for turn in range(turns):
                body = contract.prepare_request({"model": model, "messages": list(messages), "max_tokens": 24})
                reply = await http.post(f"{targets()}/v1/chat/completions", json=body)
                if not reply.is_success:
                    failures += 1
                    return
                content = reply.json()["choices"][0]["message"]["content"] or ""
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": f"Turn {turn}: the test still fails, try again."},
                ]

        await asyncio.gather(*(session(i) for i in range(sessions)))
    return failures


def cache_share(
    engines: list[str], targets: Callable[[], str], model: str, sessions: int, turns: int
) -> dict[str, Any]:
    for url in engines:
        httpx.post(f"{url}/flush_cache", timeout=10)
    failures = asyncio.run(_sessions(targets, model, sessions, turns))
    stats = [httpx.get(f"{url}/_emulator/stats", timeout=10).json() for url in engines]
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    return {
        "cache_share": cached / prompt if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "failures": failures,
        "per_engine_prompt_tokens": [s["prompt_tokens"] for s in stats],
    }


def _round_robin(urls: list[str]) -> Callable[[], str]:
    counter = {"next": 0}

    def pick() -> str:  # one shared counter for all sessions, as Polar's InferenceClient keeps one
        url = urls[counter["next"] % len(urls)]
        counter["next"] += 1
        return url

    return pick


def affinity(
    profile: profiles.Profile, state: local.LocalState, model: str, sessions: int, turns: int
) -> dict[str, Any]:
    engines = state.engine_urls
    out: dict[str, Any] = {}
    release = profile.router
    if release is not None:
        # the profile's router as `local.up` launched it: with the profile's ROUTER_ARGS (docs/routing.md)
        label = (
            f"router as shipped ({' '.join(profile.router_args)})" if profile.router_args else "router default policy"
        )
        out[label] = cache_share(engines, lambda: state.base_url, model, sessions, turns)
        router = start_router(release, engines, extra_args=["--policy", "round_robin"])
        try:
            out["router round_robin"] = cache_share(engines, lambda: router.url, model, sessions, turns)
        finally:
            router.stop(timeout=2.0)
    out["Polar worker bypass"] = cache_share(engines, _round_robin(engines), model, sessions, turns)
    return out


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_bench(
    names: list[str] | None = None,
    *,
    reps: int = 3,
    latency_requests: int = 200,
    throughput_requests: int = 128,
    concurrencies: tuple[int, ...] = (1, 8, 32),
    sessions: int = 16,
    turns: int = 6,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names or list(profiles.PROFILE_ORDER):
        profile = profiles.load(name)
        with tempfile.TemporaryDirectory(prefix="polarstack-bench-") as tmp:
            state = local.up(profile, directory=Path(tmp), progress=lambda m: None)
            try:
                model = _model(state.engine_urls[0])
                reps_out = []
                for rep in range(reps):
                    progress(f"bench: {name} repetition {rep + 1}/{reps}")
                    options = SmokeOptions(knobs=tool_exchange.knobs_from(profile.settings))  # the profile's knobs
                    smoke = run_smoke(SmokeTarget(state.base_url, route=profile.route), options)
                    row = {
                        "smoke_seconds": smoke.elapsed,
                        "smoke_verdict": "pass" if smoke.ok else smoke.code.name,
                        "latency": latency(state.base_url, state.engine_urls[0], model, latency_requests),
                        "throughput": {
                            str(c): asyncio.run(_throughput(state.base_url, model, c, throughput_requests))
                            for c in concurrencies
                        },
                    }
                    reps_out.append(row)
                progress(f"bench: {name} sessions")
                results[name] = {
                    "router": profile.router.spec if profile.router else "none",
                    "engines": len(state.engine_urls),
                    "smoke_verdict": reps_out[-1]["smoke_verdict"],
                    "smoke_seconds": _summary([r["smoke_seconds"] for r in reps_out]),
                    "added_median_ms": _summary([r["latency"]["added_median_ms"] for r in reps_out]),
                    "added_p99_ms": _summary([r["latency"]["added_p99_ms"] for r in reps_out]),
                    "via_median_ms": _summary([r["latency"]["via_median_ms"] for r in reps_out]),
                    "throughput": {
                        c: _summary([r["throughput"][c]["requests_per_s"] for r in reps_out])
                        for c in map(str, concurrencies)
                    },
                    "token_yield": _summary([r["throughput"][str(concurrencies[-1])]["token_yield"] for r in reps_out]),
                    "failures": sum(r["throughput"][c]["failures"] for r in reps_out for c in map(str, concurrencies)),
                    "affinity": affinity(profile, state, model, sessions, turns) if len(state.engine_urls) > 1 else {},
                    "repetitions": reps_out,
                }
            finally:
                local.down(directory=Path(tmp))
    base = results.get("engine-direct")
    if base:
        for row in results.values():
            row["vs_engine_direct"] = {
                "via_median_latency": row["via_median_ms"]["median"] / base["via_median_ms"]["median"],
                **{
                    f"throughput_c{c}": row["throughput"][c]["median"] / base["throughput"][c]["median"]
                    for c in row["throughput"]
                },
            }
    return {
        "generated": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "reps": reps,
        "latency_requests": latency_requests,
        "throughput_requests": throughput_requests,
        "concurrencies": list(concurrencies),
        "sessions": sessions,
        "turns": turns,
        "profiles": results,
    }


def to_markdown(data: dict[str, Any], command: str) -> str:
    c = data["concurrencies"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` on {data['generated']}, on {data['machine']}.",
        f"{data['reps']} repetitions per profile; each cell is the median with the (min-max) spread over them. "
        f"Latency: {data['latency_requests']} interleaved sequential requests each way (router and engine-0). "
        f"Throughput: {data['throughput_requests']} Polar-shaped requests at each concurrency. "
        "Yield: token ids Polar can extract / tokens the engines generated.",
        "",
        f"> {CPU_NOTE}",
        "",
        "| profile | router | smoke | smoke s | added median ms | added p99 ms | "
        + " | ".join(f"req/s c={x}" for x in c)
        + " | token yield | req/s c="
        + str(c[-1])
        + " vs engine-direct |",
        "|" + "---|" * (7 + len(c)),
    ]
    for name, row in data["profiles"].items():
        ratio = row.get("vs_engine_direct", {}).get(f"throughput_c{c[-1]}")
        ratio_text = f"{ratio:.2f}" if ratio is not None else "-"
        lines.append(
            f"| {name} | {row['router']} | {row['smoke_verdict']} | {spread(row['smoke_seconds'])} | "
            f"{spread(row['added_median_ms'])} | {spread(row['added_p99_ms'])} | "
            + " | ".join(spread(row["throughput"][str(x)], 0) for x in c)
            + f" | {spread(row['token_yield'], 2)} | {ratio_text} |"
        )
    lines += [
        "",
        f"## Prefix-cache share ({data['sessions']} concurrent sessions x {data['turns']} turns, 2 engines)",
        "",
        "Share of prompt tokens the engines served from their prefix caches (sglang reports it as "
        "`meta_info.cached_tokens`); a turn that lands on another engine than the previous turn recomputes "
        "the whole shared prefix.",
        "",
        "| profile | routing | cache share | prompt tokens | cached tokens | prompt tokens per engine |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in data["profiles"].items():
        for routing, aff in row.get("affinity", {}).items():
            lines.append(
                f"| {name} | {routing} | {aff['cache_share']:.3f} | {aff['prompt_tokens']} | "
                f"{aff['cached_tokens']} | {aff['per_engine_prompt_tokens']} |"
            )
    lines += ["", "![latency and throughput per profile](benchmarks.png)", ""]
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["profiles"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    med = [data["profiles"][n]["via_median_ms"]["median"] for n in names]
    lo = [m - data["profiles"][n]["via_median_ms"]["min"] for m, n in zip(med, names, strict=False)]
    hi = [data["profiles"][n]["via_median_ms"]["max"] - m for m, n in zip(med, names, strict=False)]
    left.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c72b0")
    left.set_ylabel("median latency through the base URL (ms)")
    left.set_title("Latency (sequential, max_tokens 1)")
    left.tick_params(axis="x", rotation=15)
    for name in names:
        xs = [int(c) for c in data["profiles"][name]["throughput"]]
        ys = [data["profiles"][name]["throughput"][str(x)]["median"] for x in xs]
        right.plot(xs, ys, marker="o", label=name)
    right.set_xscale("log", base=2)
    right.set_xlabel("concurrency")
    right.set_ylabel("requests per second (emulated engines)")
    right.set_title("Throughput")
    right.legend()
    fig.suptitle(f"polarstack bench, {data['generated']} (CPU emulator: HTTP path only)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(data: dict[str, Any], out_dir: Path, command: str) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmarks.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "benchmarks.md").write_text(to_markdown(data, command))
    plot(data, out_dir / "benchmarks.png")
    return {
        "json": str(out_dir / "benchmarks.json"),
        "markdown": str(out_dir / "benchmarks.md"),
        "plot": str(out_dir / "benchmarks.png"),
    }
