"""`polarstack bench --routing`: every routing mode of every router profile under the agent-shaped workload.

Per profile with a router, per routing mode (the release's default, each `--policy` it offers, the settings
the profile ships in ROUTER_ARGS, tuned candidates) a fresh router runs in front of the same two emulated
engines (with service time: `emulate-engine --prefill-us-per-token/--decode-us-per-token`), the engines'
caches and served logs are flushed, and polarstack.bench.workload runs its sessions through it. Polar's worker
bypass (src/polar/gateway/proxy.py, InferenceClient._completion_url: round-robin per request over
GET /workers) does not depend on the router, so it runs once. The smoke runs once per profile through the
shipped settings (the stock-router diagnostic must still answer TOKENS_MISSING).

Every router here gets its engines through --worker-urls (slime's POST /workers registration changes how
workers become known, not how the policy routes).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from polarstack.bench import workload
from polarstack.checks import tool_exchange
from polarstack.checks.measure import machine
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.processes import stop_pid
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.harness import start as start_router
from polarstack.stack import profiles
from polarstack.stack.engines import stack_parser, start_emulator

PREFILL_US_PER_TOKEN = 50.0  # ~20k prefill tokens/s per engine; a modelling choice, not a GPU measurement
DECODE_US_PER_TOKEN = 500.0
# The routing key header the sglang-router 0.3.2 / smg binaries name (`strings` of their extension module).
SESSION_HEADER = "x-smg-routing-key"


@dataclass(frozen=True)
class Mode:
    label: str
    args: tuple[str, ...]
    session_header: str | None = None

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "args": list(self.args), "session_header": self.session_header}


DEFAULT_POLICY = "cache_aware"  # the `--policy` default of all three pinned releases (their --help)
KEYED_POLICIES = ("manual", "consistent_hashing")  # route by a routing key header when one is sent


def modes(release: RouterRelease, shipped: list[str], extra: list[list[str]] | None = None) -> list[Mode]:
    """The release's default, every other --policy it offers (passthrough is for PD layouts), the session-keyed
    policies once more with a key header (what a key would give; Polar sends none), shipped and extra flags."""
    out = [Mode(f"default ({DEFAULT_POLICY}, no flags)", ())]
    out += [
        Mode(f"--policy {p}", ("--policy", p)) for p in release.policies if p not in ("passthrough", DEFAULT_POLICY)
    ]
    out += [
        Mode(f"--policy {p} + session header (not sent by Polar)", ("--policy", p), SESSION_HEADER)
        for p in release.policies
        if p in KEYED_POLICIES
    ]
    for args in [shipped, *(extra or [])]:
        if args and tuple(args) not in {m.args for m in out if m.session_header is None}:
            out.append(Mode(("shipped: " if args == shipped else "candidate: ") + shlex.join(args), tuple(args)))
    return out


def _flush(engines: list[str]) -> None:
    for url in engines:
        httpx.post(f"{url}/flush_cache", timeout=30).raise_for_status()


def measure(
    engines: list[str],
    pick: Callable[[int], str],
    load: workload.AgentWorkload,
    model: str,
    session_header: str | None = None,
) -> dict[str, Any]:
    _flush(engines)
    run = asyncio.run(workload.run_sessions(load, pick, model, session_header=session_header))
    m = workload.metrics(workload.collect(engines), len(engines))
    m.update(
        {
            "wall_seconds": run.wall_seconds,
            "turns_ok": run.turns_ok,
            "failures": run.failures,
            "first_error": run.first_error,
            "turns_per_s": run.turns_ok / run.wall_seconds if run.wall_seconds else 0.0,
            "median_latency_s": sorted(run.latencies)[len(run.latencies) // 2] if run.latencies else 0.0,
        }
    )
    m["goals"] = workload.meets_goals(m)
    return m


def summary(m: dict[str, Any]) -> str:
    return (
        f"prompt tokens % {_pct(m['prompt_token_share'])}, affinity {m['session_affinity'] * 100:.1f}%, "
        f"cache/ideal {m['cache_vs_ideal']:.3f}, {m['turns_per_s']:.1f} turns/s, failures {m['failures']}"
    )


def bypass_picker(engines: list[str]) -> Callable[[int], str]:
    """Polar's bypass: one shared counter, the next worker per request (proxy.py, `_next_worker_index`)."""
    state = {"next": 0}

    def pick(_session: int) -> str:
        url = engines[state["next"] % len(engines)]
        state["next"] += 1
        return url

    return pick


def run(
    names: list[str] | None,
    load: workload.AgentWorkload,
    *,
    prefill_us: float = PREFILL_US_PER_TOKEN,
    decode_us: float = DECODE_US_PER_TOKEN,
    extra_modes: dict[str, list[list[str]]] | None = None,
    progress: Callable[[str], None] = print,
    settings: Mapping[str, str],
) -> dict[str, Any]:
    """Every routing mode of the profiles with a router under `load`, on two emulated engines that run the stack's
    tool-call parser (`settings`: the stack's settings, the site's)."""
    chosen = [profiles.load(n) for n in (names or profiles.PROFILE_ORDER)]
    chosen = [p for p in chosen if p.router is not None]
    engine_args = ["--prefill-us-per-token", str(prefill_us), "--decode-us-per-token", str(decode_us)]
    parser = stack_parser(settings)
    started = [start_emulator(seed=i, engine_args=engine_args, tool_call_parser=parser) for i in range(2)]
    engines = [f"http://127.0.0.1:{port}" for _, port in started]
    model = httpx.get(f"{engines[0]}/v1/models", timeout=10).json()["data"][0]["id"]
    out: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "workload": load.describe(),
        "engines": len(engines),
        "prefill_us_per_token": prefill_us,
        "decode_us_per_token": decode_us,
        "session_header": SESSION_HEADER,
        "profiles": {},
    }
    try:
        progress("routing: Polar worker bypass")
        out["bypass"] = measure(engines, bypass_picker(engines), load, model)
        progress("  " + summary(out["bypass"]))
        for profile in chosen:
            release = profile.router
            row: dict[str, Any] = {
                "router": release.spec,
                "policies": list(release.policies),
                "shipped_args": profile.router_args,
                "route": profile.route,
                "expect_smoke": profile.expect,
                "modes": [],
            }
            for mode in modes(release, profile.router_args, (extra_modes or {}).get(profile.name)):
                progress(f"routing: {profile.name} {mode.label}")
                router = start_router(release, engines, extra_args=list(mode.args))
                try:
                    m = measure(engines, lambda _s, url=router.url: url, load, model, mode.session_header)
                    if mode.args == tuple(profile.router_args) and mode.session_header is None:
                        options = SmokeOptions(knobs=tool_exchange.knobs_from(profile.settings))  # the profile's knobs
                        smoke = run_smoke(SmokeTarget(router.url, route=profile.route), options)
                        row["smoke"] = "pass" if smoke.ok else smoke.code.name
                finally:
                    router.stop(timeout=5.0)
                progress("  " + summary(m))
                row["modes"].append(
                    {
                        **mode.describe(),
                        "shipped": mode.args == tuple(profile.router_args) and mode.session_header is None,
                        "metrics": m,
                    }
                )
            out["profiles"][profile.name] = row
        out["shared_prefix_tokens"] = max(
            [r["metrics"].get("shared_prefix_tokens", 0) for p in out["profiles"].values() for r in p["modes"]] + [0]
        )
    finally:
        for process, _ in started:
            stop_pid(process.pid, process)
    return out


# --- report ----------------------------------------------------------------------------------------------


def _pct(values: list[float]) -> str:
    return "/".join(f"{v * 100:.0f}" for v in values)


def _row(profile: str, router: str, label: str, m: dict[str, Any]) -> str:
    g = m["goals"]
    ok = "yes" if all(g.values()) else "no (" + ", ".join(k for k, v in g.items() if not v) + ")"
    return (
        f"| {profile} | {router} | {label} | {_pct(m['request_share'])} | {_pct(m['prompt_token_share'])} | "
        f"{m['session_affinity'] * 100:.1f} | {m['cache_share']:.3f} | {m['ideal_cache_share']:.3f} | "
        f"{m['cache_vs_ideal']:.3f} | {m['turns_per_s']:.1f} | {m['median_latency_s'] * 1000:.0f} | "
        f"{m['failures']} | {ok} |"
    )


def to_markdown_table(data: dict[str, Any]) -> list[str]:
    lines = [
        "| profile | router | routing mode | requests % per engine | prompt tokens % per engine | "
        "session affinity % | cache share | ideal | cache / ideal | turns/s | median latency ms | failures | "
        "all goals |",
        "|" + "---|" * 13,
    ]
    lines.append(_row("any", "none", "Polar worker bypass (round-robin per request)", data["bypass"]))
    for name, row in data["profiles"].items():
        for mode in row["modes"]:
            label = mode["label"] + (" **(shipped)**" if mode["shipped"] else "")
            lines.append(_row(name, row["router"], label, mode["metrics"]))
    return lines


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("bypass", data["bypass"])]
    for name, row in data["profiles"].items():
        short = {"router-passthrough": "passthrough", "patched-router": "patched", "stock-router": "stock"}.get(
            name, name
        )
        for mode in row["modes"]:
            label = mode["label"].replace("--policy ", "").replace("default (no flags)", "default")
            label = label.replace(" + session header (not sent by Polar)", " +key").replace(", no flags", "")
            rows.append((f"{short}: {label[:38]}", mode["metrics"]))
    labels = [r[0] for r in rows]
    ys = range(len(rows))
    fig, axes = plt.subplots(1, 4, figsize=(18, 0.32 * len(rows) + 1.8), sharey=True)
    series = [
        ("max engine prompt-token share", [max(m["prompt_token_share"]) for _, m in rows], (0.45, 0.55)),
        ("session affinity", [m["session_affinity"] for _, m in rows], (0.95, 1.0)),
        ("cache share / ideal", [m["cache_vs_ideal"] for _, m in rows], (0.95, 1.0)),
        ("turns per second (emulated)", [m["turns_per_s"] for _, m in rows], None),
    ]
    for ax, (title, values, band) in zip(axes, series, strict=False):
        ax.barh(list(ys), values, color="#4c72b0")
        if band:
            ax.axvspan(*band, color="#55a868", alpha=0.25)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(list(ys))
    axes[0].set_yticklabels(labels, fontsize=7)
    axes[0].invert_yaxis()
    w = data["workload"]
    fig.suptitle(
        f"polarstack bench --routing, {data['generated']}: {w['sessions']} sessions x {w['turns']} turns, "
        f"2 emulated engines (green: goal)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


BEGIN, END = "<!-- routing-table:begin (polarstack bench --routing) -->", "<!-- routing-table:end -->"


def write_outputs(data: dict[str, Any], out_dir: Path, command: str) -> dict[str, str]:
    """routing.json, routing.png, and the measured table between the markers of routing.md (its prose is
    written by hand; the table and the command line that made it are regenerated)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {**data, "command": command}
    (out_dir / "routing.json").write_text(json.dumps(data, indent=2) + "\n")
    plot(data, out_dir / "routing.png")
    doc = out_dir / "routing.md"
    block = "\n".join(
        [
            BEGIN,
            f"Generated by `{command}` on {data['generated']}, on {data['machine']}.",
            "",
            *to_markdown_table(data),
            END,
        ]
    )
    text = doc.read_text() if doc.exists() else f"# Routing\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text += "\n" + block + "\n"
    doc.write_text(text)
    return {"json": str(out_dir / "routing.json"), "markdown": str(doc), "plot": str(out_dir / "routing.png")}
