"""`polarstack bench`: every profile measured on the local runtime, or (--routing) every routing mode."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from polarstack.bench import compare as bench
from polarstack.bench import routing as routing_bench
from polarstack.bench import workload
from polarstack.cli.render import print_json, render_bench, render_routing_bench
from polarstack.errors import ExitCode, StackError


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measure every profile on the local runtime side by side")
    p.add_argument("--profiles", nargs="+", default=None, help="subset of profiles (default: all four)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per profile (default 3)")
    p.add_argument("--latency-requests", type=int, default=200, help="sequential requests each way (default 200)")
    p.add_argument("--throughput-requests", type=int, default=128, help="requests per concurrency (default 128)")
    p.add_argument("--sessions", type=int, default=16, help="concurrent multi-turn sessions (default 16)")
    p.add_argument("--turns", type=int, default=6, help="turns per session (default 6)")
    p.add_argument("--out", default="docs", help="where benchmarks.md/.json/.png go (default docs)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    g = p.add_argument_group(
        "routing (--routing: the agent-shaped workload through every routing mode, "
        "docs/routing.md; writes routing.json/.png and the table in routing.md)"
    )
    g.add_argument("--routing", action="store_true", help="run the routing comparison instead of the HTTP-path bench")
    g.add_argument(
        "--agent-sessions", type=int, choices=(16, 64, 128), default=64, help="concurrent agent sessions (default 64)"
    )
    g.add_argument("--agent-turns", type=int, default=6, help="turns per session (default 6)")
    g.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=None,
        help="emulated prefill time per uncached prompt token (default 50)",
    )
    g.add_argument(
        "--decode-us-per-token", type=float, default=None, help="emulated decode time per generated token (default 500)"
    )
    g.add_argument(
        "--candidate",
        action="append",
        default=[],
        metavar="PROFILE=ARGS",
        help="also measure these router flags for PROFILE (repeatable), e.g. "
        "'router-passthrough=--cache-threshold 0.99'",
    )
    p.set_defaults(handler=_cmd_bench)


def _require_plotting() -> None:
    """Both benches end by drawing their plot with matplotlib (the `bench` extra): refuse before minutes of
    measuring, not with an internal error at the end (issue 17)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise StackError(
            "polarstack bench draws its plot with matplotlib, which is not installed: run `make bench` (it installs "
            "the bench extra) or `pip install -e '.[bench]'`, then run the bench again.",
            ExitCode.ENVIRONMENT,
        )


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.routing:
        return _cmd_bench_routing(args)
    for name in ("reps", "latency_requests", "throughput_requests", "sessions", "turns"):
        if getattr(args, name) < 1:
            raise StackError(f"--{name.replace('_', '-')} must be at least 1.", ExitCode.USAGE)
    _require_plotting()
    data = bench.run_bench(
        args.profiles,
        reps=args.reps,
        latency_requests=args.latency_requests,
        throughput_requests=args.throughput_requests,
        sessions=args.sessions,
        turns=args.turns,
        progress=lambda m: print(m, file=sys.stderr),
    )
    return write_and_show(args, data, bench.write_outputs, render_bench)


def write_and_show(args: argparse.Namespace, data, write, render) -> int:
    """Write the outputs under --out (recording the command as typed: cli._main sets args.command_words), then
    print the JSON or the tables."""
    words = args.command_words
    command = "polarstack bench" + ("" if len(words) <= 1 else " " + " ".join(words[1:]))
    paths = write(data, Path(args.out), command)
    if args.json:
        print_json(data)
        return 0
    render(data, paths)
    return 0


def _candidates(items: list[str]) -> dict[str, list[list[str]]]:
    """--candidate PROFILE=FLAGS, each as PROFILE -> its lists of router flags (USAGE for anything else)."""
    import shlex

    extra: dict[str, list[list[str]]] = {}
    for item in items:
        name, sep, flags = item.partition("=")
        if not sep or not flags.strip():
            raise StackError(
                f"--candidate {item!r} must look like PROFILE=FLAGS, e.g. "
                "'patched-router=--policy consistent_hashing'.",
                ExitCode.USAGE,
            )
        extra.setdefault(name, []).append(shlex.split(flags))
    return extra


def _cmd_bench_routing(args: argparse.Namespace) -> int:
    if args.agent_turns < 2:
        raise StackError(
            "--agent-turns must be at least 2 (affinity compares a turn with the previous one).", ExitCode.USAGE
        )
    extra = _candidates(args.candidate)
    _require_plotting()
    load = workload.AgentWorkload(sessions=args.agent_sessions, turns=args.agent_turns)
    data = routing_bench.run(
        args.profiles,
        load,
        prefill_us=routing_bench.PREFILL_US_PER_TOKEN
        if args.prefill_us_per_token is None
        else args.prefill_us_per_token,
        decode_us=routing_bench.DECODE_US_PER_TOKEN if args.decode_us_per_token is None else args.decode_us_per_token,
        extra_modes=extra,
        progress=lambda m: print(m, file=sys.stderr),
        settings=args.site.settings,  # the stack's tool-call parser for the emulated engines, as the site read it
    )
    return write_and_show(args, data, routing_bench.write_outputs, render_routing_bench)


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_bench(sub)
