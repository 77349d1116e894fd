"""The `polarstack` command: argparse subcommands as `_add_<verb>` / `_cmd_<verb>` pairs.

Expected failures are StackErrors, caught once in `main()`: one sentence on stderr and a named exit code
(errors.ExitCode). A traceback appears only with `--debug`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from typing import Any, Callable

from polarstack import __version__
from polarstack.errors import ExitCode, StackError
from polarstack.inputs import MAX_REQUESTS, MAX_TOKENS, MAX_TURNS, count, seconds, url

Handler = Callable[[argparse.Namespace], int]


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=200 if not sys.stdout.isatty() else None)


# --- emulate-engine ---------------------------------------------------------------------------------------


def _add_emulate_engine(sub) -> None:
    p = sub.add_parser("emulate-engine", help="serve an HTTP stand-in for one sglang engine (CPU only)",
                       description="Answer like sglang at the pinned version, with its own protocol models.")
    p.add_argument("--port", type=count(1, 65535), required=True, help="TCP port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--model", default=None, help="served model name (default Qwen2.5-7B-Instruct)")
    p.add_argument("--seed", type=int, default=0, help="seed for deterministic tokens and logprobs")
    p.add_argument("--tool-call-parser", default=None, metavar="NAME",
                   help="parse tool calls into message.tool_calls as sglang does with this flag (Qwen format only)")
    p.add_argument("--prefill-us-per-token", type=float, default=0.0,
                   help="modelled prefill time per uncached prompt token, one request at a time (default 0: off)")
    p.add_argument("--decode-us-per-token", type=float, default=0.0,
                   help="modelled decode time per generated token, requests overlap (default 0: off)")
    p.set_defaults(handler=_cmd_emulate_engine)


def _cmd_emulate_engine(args: argparse.Namespace) -> int:
    from polarstack import emulator

    if not 0 < args.port < 65536:
        raise StackError(f"--port {args.port} is not a TCP port.", ExitCode.USAGE)
    parser = args.tool_call_parser
    if parser is not None:
        from polarstack import toolcheck

        if parser not in toolcheck.parser_choices():
            raise StackError(f"--tool-call-parser {parser} is not a parser of the pinned sglang; choose one of "
                             f"{', '.join(toolcheck.parser_choices())}.", ExitCode.USAGE)
        if parser not in toolcheck.qwen25_names():
            raise StackError(f"--tool-call-parser {parser}: the emulator writes only the Qwen format "
                             f"(sglang's Qwen25Detector); use {' or '.join(toolcheck.qwen25_names())}.", ExitCode.USAGE)
    for name in ("prefill_us_per_token", "decode_us_per_token"):
        if not 0 <= getattr(args, name) < 1e6:
            raise StackError(f"--{name.replace('_', '-')} must be between 0 and 1e6 microseconds.", ExitCode.USAGE)
    emulator.serve(args.port, host=args.host, model=args.model or emulator.DEFAULT_MODEL, seed=args.seed,
                   tool_call_parser=parser, prefill_us_per_token=args.prefill_us_per_token,
                   decode_us_per_token=args.decode_us_per_token)
    return 0


# --- smoke ------------------------------------------------------------------------------------------------


def _add_smoke(sub) -> None:
    p = sub.add_parser("smoke", help="prove the path yields trainable tokens before GRPO launches",
                       description="Send Polar-shaped chat requests, extract token ids as Polar does, check invariants.")
    p.add_argument("--base-url", default=None, type=url,
                   help="Polar's inference base URL (router or engine); default: the profile that is up locally")
    p.add_argument("--model", default=None, help="model name to send (default: first id of GET /v1/models)")
    p.add_argument("--requests", type=count(0, MAX_REQUESTS), default=2,
                   help=f"single-turn requests (default 2, at most {MAX_REQUESTS})")
    p.add_argument("--turns", type=count(0, MAX_TURNS), default=2,
                   help=f"turns of the multi-turn session (default 2; 0 skips it; at most {MAX_TURNS})")
    p.add_argument("--timeout", type=seconds, default=10.0, help="seconds per request, in total (default 10)")
    p.add_argument("--max-tokens", type=count(1, MAX_TOKENS), default=16, help="max_tokens per request (default 16)")
    p.add_argument("--route", choices=("base", "polar"), default=None,
                   help="base: every request to --base-url (older Polar); polar: resolve like current Polar's "
                        "client (GET /workers, then straight to regular workers); default: the profile's "
                        "POLAR_ROUTE when a profile is up, else base")
    p.add_argument("--profile", default=None,
                   help="check a profile of the docker runtime: its base URL, route and (for slime-registered "
                        "routers) a temporary registration of its engines")
    p.add_argument("--runtime", choices=("auto", "local", "docker"), default="auto",
                   help="without --base-url: local (the run state of `polarstack up`), docker (--profile's ports), "
                        "or auto (local when a profile is up locally, else docker)")
    p.add_argument("--strict", action="store_true",
                   help="fail (exit 4) on findings Polar does not enforce: usage mismatch, positive logprobs, coerced "
                        "id types, aligned-prefix training, extra choices")
    p.add_argument("--allow-retokenized", action="store_true",
                   help="pass when Polar would train only on ids its builder re-tokenizes from text (exit 15 otherwise)")
    p.add_argument("--polar-config", default=None, metavar="PATH",
                   help="the Polar config the smoke guards (slime's --custom-config-path, e.g. a rendered "
                        "polar_config.yaml): its builder tokenizer decides whether Polar re-tokenizes; default: the "
                        "template this stack renders (no tokenizer)")
    p.add_argument("--in-trainer", action="store_true",
                   help="run by `make smoke` inside the trainer container (docker runtime): check --profile's ports "
                        "from there, with the installed Polar's second opinion; refused where Polar is not importable")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_cmd_smoke)


def _cmd_smoke(args: argparse.Namespace) -> int:
    from polarstack import retokenize
    from polarstack.smoke import run_smoke

    base_url, route, register, engine_urls = args.base_url, args.route, None, None
    tokenizer_name = retokenize.configured_name(retokenize.read_config(args.polar_config) if args.polar_config
                                                else None)
    if args.in_trainer and (base_url is not None or args.profile is None):
        raise StackError("--in-trainer takes --profile and no --base-url (`make smoke` passes them); run `make smoke` "
                         "on the host instead.", ExitCode.USAGE)
    if base_url is None and args.runtime in ("auto", "local") and not args.in_trainer:
        from polarstack.local import read_state

        state = read_state()
        if state is not None:  # a recorded local stack: use it, or refuse (STATE) when it died or is half-written
            state.usable()
            base_url, route = state.base_url, route or state.data.get("route", "base")
            engine_urls = list(state.data.get("engine_urls") or [])
        elif args.runtime == "local":
            raise StackError("no profile is up locally and no --base-url was given; run `make up PROFILE=engine-direct "
                             "RUNTIME=local` or pass --base-url.", ExitCode.USAGE)
    if base_url is None:
        from polarstack import docker_smoke, docker_state, profiles

        # The docker runtime: the profile `make up` recorded, when it is the one asked for and still runs (STATE
        # otherwise); with --runtime auto and nothing up anywhere there is nothing to check.
        if args.profile is None and args.runtime == "auto" and docker_state.read() is None:
            raise StackError("no profile is up (locally or under Docker) and no --base-url or --profile was given; run "
                             "`make up PROFILE=engine-direct` (add RUNTIME=local without a GPU) or pass --base-url.",
                             ExitCode.USAGE)
        if not args.in_trainer:  # on the host: check the record, then run this smoke inside the trainer
            profile = profiles.load(docker_state.usable(args.profile)["profile"])
            result = docker_smoke.run_in_trainer(args, profile)
            if args.json:
                _print_json(result)
            else:
                docker_smoke.render(result, profile.name)
            if result["verdict"] != "pass":
                raise StackError(result["message"], ExitCode(result["exit_code"]))
            return 0
        profile = profiles.load(args.profile)
        docker_smoke.check_inside_trainer(profile)
        base_url = profile.base_url()
        route = route or profile.route
        engine_urls = [f"http://127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]
        if profile.registration == "register" and profile.polar_base == "router":
            register = list(engine_urls)
    report = run_smoke(base_url, model=args.model, requests=args.requests, turns=args.turns,
                       timeout=args.timeout, route=route or "base", max_tokens=args.max_tokens, register=register,
                       strict=args.strict, allow_retokenized=args.allow_retokenized, tokenizer_name=tokenizer_name,
                       engine_urls=engine_urls)
    if args.json:
        _print_json(report.as_dict())
    else:
        _render_smoke(report)
    if not report.ok:
        raise StackError(report.message, report.code)
    return 0


def _render_smoke(report) -> None:
    from rich.table import Table

    console = _console()
    res = report.resolution
    console.print(f"smoke: route={res.route} base={res.base_url} model={report.model}")
    if res.note:
        console.print(f"  path: {res.note}")
    table = Table("#", "kind", "turn", "url", "HTTP", "ms", "prompt ids", "response ids", "trainable", "problems")
    for index, entry in enumerate(report.exchanges, 1):
        verdict = entry.get("verdict", {})
        found = verdict.get("problems", [])
        problems = f"{len(found)}: {found[0]['message'][:90]}" if found else ""
        table.add_row(str(index), entry["kind"], str(entry["turn"]), entry["url"], str(entry["status"]),
                      f"{entry['elapsed_ms']:.1f}", str(verdict.get("prompt_tokens", "-")),
                      str(verdict.get("response_tokens", "-")),
                      str(entry.get("polar", {}).get("polar_trainable_tokens", "-")),
                      problems or "-")
    if report.exchanges:
        console.print(table)
    for warning in report.warnings:
        console.print(f"  warning: {warning}")
    verdict = "PASS" if report.ok else f"FAIL ({report.code.name}, exit {int(report.code)})"
    console.print(f"verdict: {verdict}; Polar's verdict {report.polar_verdict or '-'}; trainable tokens "
                  f"{report.trainable_tokens}; {report.elapsed:.3f} s")


# --- probe ------------------------------------------------------------------------------------------------


def _add_probe(sub) -> None:
    p = sub.add_parser("probe", help="issue #52's probe: same body direct and through a path, with a diagnosis")
    p.add_argument("--direct", required=True, type=url, help="the engine's URL")
    p.add_argument("--via", required=True, type=url, help="the URL under test (usually a router)")
    p.add_argument("--model", default=None, help="model name (default: first id of the engine's /v1/models)")
    p.add_argument("--timeout", type=seconds, default=10.0, help="seconds per request, in total (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_cmd_probe)


def _cmd_probe(args: argparse.Namespace) -> int:
    from rich.table import Table

    from polarstack.probe import run_probe

    report = run_probe(args.direct, args.via, model=args.model, timeout=args.timeout)
    if args.json:
        _print_json(report.as_dict())
    elif report.direct:
        table = Table("path", "url", "HTTP", "bytes", "choices[0] keys", "trainable")
        for label, side in (("direct", report.direct), ("via", report.via)):
            if side:
                table.add_row(label, side["url"], str(side["status"]), str(side["bytes"]),
                              ", ".join(side["choice_keys"]), str(side["trainable_tokens"]))
        console = _console()
        console.print(table)
        console.print(f"diagnosis: {report.diagnosis}" + (f" ({report.evidence})" if report.evidence else ""))
    if report.code != ExitCode.OK:
        raise StackError(report.message, report.code)
    return 0


# --- up / down / status (local runtime) -------------------------------------------------------------------


def _add_up(sub) -> None:
    p = sub.add_parser("up", help="start a profile's topology (local: emulated engines + the real router)")
    p.add_argument("--profile", required=True, help="profile name (configs/profiles/<name>.env)")
    p.add_argument("--runtime", choices=("local",), default="local",
                   help="local: processes on 127.0.0.1 (the docker runtime is driven by `make up`)")
    p.add_argument("--timeout", type=seconds, default=60.0, help="seconds to wait for each process (default 60)")
    p.add_argument("--prefill-us-per-token", type=float, default=0.0,
                   help="emulated engines' prefill time per uncached prompt token (default 0: off; docs/routing.md)")
    p.add_argument("--decode-us-per-token", type=float, default=0.0,
                   help="emulated engines' decode time per generated token (default 0: off)")
    p.add_argument("--json", action="store_true", help="print the run state as JSON")
    p.set_defaults(handler=_cmd_up)


def _cmd_up(args: argparse.Namespace) -> int:
    import signal

    from polarstack import local, profiles

    profile = profiles.load(args.profile)

    def terminated(signum, _frame):  # SIGTERM (`kill`, `timeout`): stop what was started, like Ctrl-C does
        raise KeyboardInterrupt

    engine_args: list[str] = []
    for name in ("prefill_us_per_token", "decode_us_per_token"):
        value = getattr(args, name)
        if not 0 <= value < 1e6:
            raise StackError(f"--{name.replace('_', '-')} must be between 0 and 1e6 microseconds.", ExitCode.USAGE)
        if value:
            engine_args += [f"--{name.replace('_', '-')}", str(value)]
    signal.signal(signal.SIGTERM, terminated)
    state = local.up(profile, timeout=args.timeout, progress=lambda m: print(m, file=sys.stderr),
                     engine_args=engine_args)
    if args.json:
        _print_json(state.data)
    else:
        print(f"{profile.name} is up locally; Polar's base URL: {state.base_url} (route {profile.route}); "
              f"state in {state.path}")
    return 0


def _add_down(sub) -> None:
    p = sub.add_parser("down", help="stop exactly what `up` started")
    p.add_argument("--runtime", choices=("local",), default="local")
    p.set_defaults(handler=_cmd_down)


def _cmd_down(args: argparse.Namespace) -> int:
    from polarstack import local

    stacks = local.down_all()  # `up`'s stack and whatever a killed `demo` left in .run/demo/
    if not stacks:
        print("nothing is up locally; nothing to stop.", file=sys.stderr)
    for profile, pids in stacks:
        print(f"{profile} is down (stopped pids {', '.join(map(str, pids)) or 'none: all had exited'}).")
    return 0


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="what the local runtime has up")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    from polarstack import local

    state = local.read_state()
    data = {"up": False} if state is None else {"up": bool(state.live()), **state.data,
                                                "live_pids": [p["pid"] for p in state.live()]}
    if args.json:
        _print_json(data)
    elif state is None:
        print("nothing is up locally.")
    else:
        for proc in state.processes:
            alive = "running" if proc in state.live() else "gone"
            print(f"{proc['role']:10} pid {proc['pid']:>7} {proc['url']} {alive}")
        print(f"profile {state.data['profile']}: base URL {state.data.get('base_url')}")
    return 0


# --- demo -------------------------------------------------------------------------------------------------


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="every profile up locally in turn, smoke, a table; exit 0 if all as expected")
    p.add_argument("--profiles", nargs="+", default=None, help="subset of profiles (default: all four)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    import time

    from rich.table import Table

    from polarstack.demo import run_demo

    started = time.perf_counter()
    rows = run_demo(args.profiles, progress=lambda m: print(m, file=sys.stderr))
    elapsed = time.perf_counter() - started
    if args.json:
        _print_json({"rows": rows, "elapsed_seconds": round(elapsed, 2)})
    else:
        table = Table("profile", "router release", "expected", "verdict", "trainable tokens", "smoke s", "as expected")
        for row in rows:
            table.add_row(row["profile"], row["router"], row["expected"], row["verdict"], str(row["trainable_tokens"]),
                          "-" if row.get("smoke_seconds") is None else f"{row['smoke_seconds']:.3f}",
                          "yes" if row["as_expected"] else "NO")
        console = _console()
        console.print(table)
        console.print(f"demo finished in {elapsed:.1f} s")
    wrong = [row for row in rows if not row["as_expected"]]
    if wrong:
        row = wrong[0]
        raise StackError(f"profile {row['profile']} gave {row['verdict']} where {row['expected']} was expected: "
                         f"{row['message']}", ExitCode.GATE if row["expected"] == "pass" else ExitCode.INVARIANT)
    return 0


# --- compose (docker runtime) ------------------------------------------------------------------------------

COMPOSE_VERBS = {  # verb: (compose arguments, needs GPUs)
    "up": (["up", "--detach", "--wait"], True),
    "down": (["down"], False),
    "ps": (["ps"], False),
    "logs": (["logs", "--tail", "200"], False),
    "build": (["build"], False),
}


def _add_compose(sub) -> None:
    p = sub.add_parser("compose", help="the docker runtime: render a profile for Compose v2 and drive it")
    p.add_argument("verb", choices=("env", "config", *COMPOSE_VERBS, "clean", "model", "sif"),
                   help="env: render .run/compose/<profile>.env and .gpus.yaml; config: the rendered Compose model; "
                        "model: download the weights into the models volume; sif: build the agent sandbox image")
    p.add_argument("--profile", default=None,
                   help="profile name (configs/profiles/<name>.env); default: the one `make up` started, else "
                        "engine-direct")
    p.add_argument("--yes", action="store_true", help="clean: do not ask before removing the volumes")
    p.add_argument("--service", action="append", default=[], help="limit to a service (repeatable; logs, ps, build)")
    p.set_defaults(handler=_cmd_compose)


def _cmd_compose(args: argparse.Namespace) -> int:
    from polarstack import assets, compose, docker_state, profiles

    profile = profiles.load(docker_state.profile_name(args.profile))
    if args.verb in ("model", "sif"):
        return assets.run_oneshot(args.verb, profile)
    if args.verb == "env":
        env_path, gpus_path = compose.render(profile)
        print(env_path)
        print(gpus_path)
        return 0
    if args.verb == "config":
        proc = compose.run_compose(profile, ["config"], capture=True)
        if proc.returncode != 0:
            raise StackError(f"Compose rejected profile {profile.name}: {compose._first_line(proc)}", ExitCode.USAGE)
        sys.stdout.write(proc.stdout)
        return 0
    if args.verb == "clean":
        compose.check_node("clean", profile, need_gpus=False)
        if not args.yes:
            if not sys.stdin.isatty():
                raise StackError("make clean deletes the models, checkpoints, weight-updates and logs volumes; "
                                 "rerun in a terminal to confirm, or pass --yes.", ExitCode.USAGE)
            answer = input("Delete the volumes models, checkpoints, weight-updates and logs? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted.")
                return 0
        docker_state.guard_other_profile("clean", profile)  # another profile running: refused, record kept
        code = compose.run_compose(profile, ["down", "--volumes"]).returncode
        if code == 0:
            docker_state.clear()
        return code
    compose_args, need_gpus = COMPOSE_VERBS[args.verb]
    compose.check_node(args.verb, profile, need_gpus=need_gpus)
    if args.verb in ("up", "down"):  # profiles share service names: never act on X while Y runs
        docker_state.guard_other_profile(args.verb, profile)
    if args.verb == "up":  # weights, sandbox image and agent CLI before any engine starts (one sentence each)
        assets.check_before_up(profile)
    proc = compose.run_compose(profile, [*compose_args, *args.service])
    if proc.returncode != 0:
        raise StackError(f"docker compose {args.verb} failed for profile {profile.name} (exit {proc.returncode}); "
                         "see the output above.", ExitCode.ENVIRONMENT)
    if args.verb == "up":
        print(f"{profile.name} is up (state in {docker_state.write(profile)}); `make smoke` and `make train` use it.",
              file=sys.stderr)
    elif args.verb == "down" and (docker_state.read() or {}).get("profile") in (None, profile.name):
        docker_state.clear()
    return 0


def _add_pin(sub) -> None:
    p = sub.add_parser("pin", help="resolve base-image tags in configs/pins.env to digests (needs a registry)")
    p.set_defaults(handler=_cmd_pin)


def _cmd_pin(args: argparse.Namespace) -> int:
    from polarstack.pin import run_pin

    for key, value in run_pin().items():
        print(f"{key}={value}")
    return 0


def _add_polar_switch(sub) -> None:
    p = sub.add_parser("polar-switch", help="Polar's worker-discovery switch (POLAR_WORKER_DISCOVERY=on|off)")
    p.add_argument("action", choices=("install", "status"), help="install: write the .pth hook into site-packages")
    p.set_defaults(handler=_cmd_polar_switch)


def _cmd_polar_switch(args: argparse.Namespace) -> int:
    from polarstack import polar_switch

    if args.action == "install":
        print(f"installed {polar_switch.install_pth()}")
        return 0
    print(f"{polar_switch.ENV}={'on' if polar_switch.discovery_enabled() else 'off'}")
    return 0


# --- tasks / verify / train ---------------------------------------------------------------------------------


def _add_tasks(sub) -> None:
    p = sub.add_parser("tasks", help="prepare code tasks for slime and Polar")
    tsub = p.add_subparsers(dest="tasks_cmd", required=True, metavar="{prepare}")
    prep = tsub.add_parser("prepare", help="write train.jsonl, workspaces, hidden tests and polar_config.yaml")
    prep.add_argument("task", help="humaneval or mbpp")
    prep.add_argument("--out", required=True, help="output directory")
    prep.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema instead of the Hub")
    prep.add_argument("--limit", type=int, default=None, help="only the first N problems")
    prep.add_argument("--json", action="store_true")
    prep.set_defaults(handler=_cmd_tasks_prepare)


def _cmd_tasks_prepare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from polarstack.tasks import prepare

    result = prepare(args.task, Path(args.out), source=Path(args.source) if args.source else None, limit=args.limit)
    if args.json:
        _print_json(result)
    else:
        print(f"{result['problems']} {result['task']} problems -> {result['train_jsonl']} and {result['polar_config']}")
    return 0


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="run tasks' tests in the sandbox (canonical solutions by default)")
    p.add_argument("--task", default="humaneval", help="humaneval or mbpp")
    p.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema")
    p.add_argument("--timeout", type=seconds, default=10.0, help="wall-clock seconds per program (default 10)")
    p.add_argument("--workers", type=count(1, 1024), default=None, help="parallel sandboxes (default: CPU count, at least 2)")
    p.add_argument("--isolation", choices=("namespaces", "none"), default=None,
                   help="namespaces (default) or none: opt out of the sandbox's namespaces (docs/tasks.md; also "
                        "POLARSTACK_VERIFIER_ISOLATION)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from polarstack import tasks, verifier

    if args.task == "humaneval":
        problems = tasks.load_humaneval()
        items = [(dict(p, kind="humaneval"), p["canonical_solution"]) for p in problems]
    elif args.task == "mbpp":
        problems = tasks.load_mbpp(Path(args.source) if args.source else None)
        items = [(dict(p, kind="mbpp"), p["code"]) for p in problems]
    else:
        raise StackError(f"unknown task {args.task!r}; choose one of {', '.join(tasks.TASKS)}.", ExitCode.USAGE)
    limits = verifier.Limits(timeout=args.timeout, isolation=args.isolation)
    started = time.perf_counter()
    outcomes = []
    try:
        verifier.probe_sandbox(limits)  # refuse before the first solution when the sandbox cannot be set up
    except ValueError as exc:  # a bad POLARSTACK_VERIFIER_ISOLATION
        raise StackError(f"{exc}.", ExitCode.USAGE) from None
    except RuntimeError as exc:  # IsolationUnavailable, or no interpreter / lock directory for the sandbox
        raise StackError(f"{exc}.", ExitCode.ENVIRONMENT) from None
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as progress, \
            ThreadPoolExecutor(max_workers=args.workers or max(2, __import__("os").cpu_count() or 2)) as pool:
        bar = progress.add_task(f"{args.task} canonical solutions", total=len(items))
        try:
            for outcome in pool.map(lambda pair: verifier.verify(pair[0], pair[1], limits), items):
                outcomes.append(outcome)
                progress.advance(bar)
        except RuntimeError as exc:
            raise StackError(f"{exc}.", ExitCode.ENVIRONMENT) from None
    elapsed = time.perf_counter() - started
    failed = [(items[i][0]["task_id"], o.reason) for i, o in enumerate(outcomes) if not o.passed]
    result = {"task": args.task, "problems": len(items), "passed": len(items) - len(failed), "failed": failed,
              "seconds": round(elapsed, 2)}
    if args.json:
        _print_json(result)
    else:
        print(f"{result['passed']}/{result['problems']} canonical {args.task} solutions pass in the sandbox "
              f"({elapsed:.1f} s)")
    if failed:
        raise StackError(f"{len(failed)} canonical solution(s) failed, first {failed[0][0]} ({failed[0][1]}); the "
                         "sandbox limits are too tight for this machine or the task data is wrong.", ExitCode.TASK_DATA)
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="GRPO with Polar on slime: render, gate with the smoke, launch")
    p.add_argument("--task", required=True, help="humaneval or mbpp")
    p.add_argument("--profile", default=None, help="profile (default: the one up locally, else engine-direct)")
    p.add_argument("--runtime", choices=("auto", "local", "docker"), default="auto",
                   help="auto: the local runtime when a profile is up there, else docker")
    p.add_argument("--dry-run", action="store_true", help="print and validate every command and file; launch nothing")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override configs/train/defaults.yaml (dotted key), repeatable")
    p.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema instead of the Hub")
    p.add_argument("--resume", action="store_true",
                   help="continue from the run's last checkpoint (--load of its save dir); refused when there is none")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    import os
    import time
    from pathlib import Path

    from polarstack import compose, local, profiles, tasks
    from polarstack.smoke import run_smoke
    from polarstack.train import TRAINER_RUN_DIR, build_plan, load_defaults

    if args.task not in tasks.TASKS:
        raise StackError(f"unknown task {args.task!r}; choose one of {', '.join(tasks.TASKS)}.", ExitCode.USAGE)
    state = local.read_state() if args.runtime in ("auto", "local") else None
    if state is not None:
        state.usable()  # a dead or half-written local stack refuses (STATE) instead of falling back to docker
    live = state is not None
    if args.runtime == "local" and not live:
        raise StackError("nothing is up locally; run `make up PROFILE=engine-direct RUNTIME=local` first.", ExitCode.STATE)
    runtime = "local" if live else "docker"
    from polarstack import docker_state

    docker_record = None
    if not live and (not args.dry_run or docker_state.read() is not None):
        # The docker runtime: the record of `make up` must name this profile and its stack must still run (STATE
        # otherwise); a dry run with nothing up plans the default profile.
        docker_record = docker_state.usable(args.profile)
    name = args.profile or (state.data["profile"] if live else docker_record["profile"] if docker_record
                            else docker_state.profile_name(None))
    if live and name != state.data["profile"]:
        raise StackError(f"profile {state.data['profile']} is up locally, not {name}; run `make down RUNTIME=local` "
                         f"and `make up PROFILE={name} RUNTIME=local`, or drop PROFILE.", ExitCode.STATE)
    profile = profiles.load(name)
    knobs = compose.stack_knobs()
    run_id = f"{args.task}-{name}-{time.strftime('%Y%m%dT%H%M%S')}"
    plan = build_plan(args.task, profile, run_id=run_id, config=load_defaults(args.set),
                      model_path=os.environ.get("MODEL_PATH") or knobs.get("MODEL_PATH"),
                      served_model_name=knobs.get("SERVED_MODEL_NAME"), resume=args.resume)
    if args.task == "humaneval":
        tasks.load_humaneval()  # validates the task data now, not on the GPU node
    if args.dry_run:
        if args.json:
            _print_json({"runtime": runtime, **plan.as_dict()})
        else:
            print(f"# dry run: {args.task} on profile {name} ({runtime} runtime); nothing is launched")
            print(f"# tasks: polarstack tasks prepare {args.task} --out .run/train/{run_id}/tasks")
            for command in plan.as_dict()["commands"]:
                print(command)
            for file_name, text in plan.files.items():
                print(f"# --- {TRAINER_RUN_DIR}/{run_id}/{file_name} ---")
                print(text.rstrip())
            for line in plan.as_dict()["watch"]:
                print(f"# on the GPU node, watch: {line}")
        return 0
    if runtime == "docker":
        compose.check_node("train", profile, need_gpus=True)
    base_url = state.base_url if live else profile.base_url()
    register = None
    if runtime == "docker" and profile.registration == "register" and profile.polar_base == "router":
        register = [f"http://127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]
    import yaml

    from polarstack.retokenize import configured_name

    polar_values = yaml.safe_load(plan.files["polar_config.yaml"])
    report = run_smoke(base_url, route=state.data.get("route", profile.route) if live else profile.route,
                       model=None if live else knobs.get("SERVED_MODEL_NAME"), register=register,
                       tokenizer_name=configured_name(polar_values),
                       allow_retokenized=bool(polar_values.get("polar_gate_allow_retokenized")))
    if not report.ok:
        raise StackError(f"refusing to launch {args.task} on {name}: {report.message}", ExitCode.GATE)
    print(f"gate passed: {report.message}", file=sys.stderr)
    if runtime == "local":
        raise StackError(f"the gate passed, but training needs the GPU stack, which the local runtime does not have: "
                         f"on the GPU node run `make up PROFILE={name}` and then `make train TASK={args.task}`.",
                         ExitCode.ENVIRONMENT)
    from polarstack import assets

    assets.check_in_trainer(profile)  # apptainer, the SIF and the agent CLI dir, looked up inside the trainer
    out = local.run_dir() / "train" / run_id
    tasks.prepare(args.task, out / "tasks", source=Path(args.source) if args.source else None,
                  tasks_dir_in_trainer=f"{TRAINER_RUN_DIR}/{run_id}/tasks")
    for file_name, text in plan.files.items():
        (out / file_name).write_text(text)
    from polarstack.train import RESUME_REFUSED, watch_lines

    print("what to watch on the GPU node:\n  " + "\n  ".join(watch_lines(plan)), file=sys.stderr)
    (out / "gate-abort.txt").unlink(missing_ok=True)  # a sentence left by an earlier attempt of this run is stale
    proc = compose.run_compose(profile, ["exec", "-T", "trainer", "bash", f"{TRAINER_RUN_DIR}/{run_id}/launch.sh"])
    if proc.returncode != 0 and (out / "gate-abort.txt").is_file():  # every in-job gate stop writes its sentence
        raise StackError((out / "gate-abort.txt").read_text().strip(), ExitCode.GATE)
    if proc.returncode == RESUME_REFUSED:  # launch.sh's checkpoint guard (train.checkpoint_guard) said why
        raise StackError(f"the trainer refused run {run_id}: " + (
            f"RESUME=1 found no checkpoint in {plan.checkpoint_dir}; run make train without RESUME to start it."
            if args.resume else f"{plan.checkpoint_dir} already holds a checkpoint; make train RESUME=1 continues it, or "
            "SET=checkpoint.run_name=NEW starts another run."),
            ExitCode.STATE)
    if proc.returncode != 0:
        raise StackError(f"the training job of run {run_id} failed (exit {proc.returncode}); see `make logs "
                         f"SERVICE=trainer` and {out}.", ExitCode.ENVIRONMENT)
    return 0


# --- bench --------------------------------------------------------------------------------------------------


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
    g = p.add_argument_group("routing (--routing: the agent-shaped workload through every routing mode, "
                             "docs/routing.md; writes routing.json/.png and the table in routing.md)")
    g.add_argument("--routing", action="store_true", help="run the routing comparison instead of the HTTP-path bench")
    g.add_argument("--agent-sessions", type=int, choices=(16, 64, 128), default=64,
                   help="concurrent agent sessions (default 64)")
    g.add_argument("--agent-turns", type=int, default=6, help="turns per session (default 6)")
    g.add_argument("--prefill-us-per-token", type=float, default=None,
                   help="emulated prefill time per uncached prompt token (default 50)")
    g.add_argument("--decode-us-per-token", type=float, default=None,
                   help="emulated decode time per generated token (default 500)")
    g.add_argument("--candidate", action="append", default=[], metavar="PROFILE=ARGS",
                   help="also measure these router flags for PROFILE (repeatable), e.g. "
                        "'router-passthrough=--cache-threshold 0.99'")
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.table import Table

    from polarstack import bench

    if args.routing:
        return _cmd_bench_routing(args)
    for name in ("reps", "latency_requests", "throughput_requests", "sessions", "turns"):
        if getattr(args, name) < 1:
            raise StackError(f"--{name.replace('_', '-')} must be at least 1.", ExitCode.USAGE)
    data = bench.run_bench(args.profiles, reps=args.reps, latency_requests=args.latency_requests,
                           throughput_requests=args.throughput_requests, sessions=args.sessions, turns=args.turns,
                           progress=lambda m: print(m, file=sys.stderr))
    command = "polarstack bench" + ("" if len(sys.argv) <= 2 else " " + " ".join(sys.argv[2:]))
    paths = bench.write_outputs(data, Path(args.out), command)
    if args.json:
        _print_json(data)
        return 0
    c = data["concurrencies"]
    table = Table("profile", "router", "smoke", "smoke s", "added median ms", "added p99 ms",
                  *[f"req/s c={x}" for x in c], "yield")
    for name, row in data["profiles"].items():
        table.add_row(name, row["router"], row["smoke_verdict"], bench._fmt(row["smoke_seconds"]),
                      bench._fmt(row["added_median_ms"]), bench._fmt(row["added_p99_ms"]),
                      *[bench._fmt(row["throughput"][str(x)], 0) for x in c], bench._fmt(row["token_yield"], 2))
    console = _console()
    console.print(table)
    affinity = Table("profile", "routing", "cache share", "prompt tokens per engine")
    for name, row in data["profiles"].items():
        for routing, aff in row.get("affinity", {}).items():
            affinity.add_row(name, routing, f"{aff['cache_share']:.3f}", str(aff["per_engine_prompt_tokens"]))
    console.print(affinity)
    console.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")
    return 0


def _cmd_bench_routing(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from rich.table import Table

    from polarstack import routing_bench, workload

    if args.agent_turns < 2:
        raise StackError("--agent-turns must be at least 2 (affinity compares a turn with the previous one).",
                         ExitCode.USAGE)
    extra: dict[str, list[list[str]]] = {}
    for item in args.candidate:
        name, sep, flags = item.partition("=")
        if not sep or not flags.strip():
            raise StackError(f"--candidate {item!r} must look like PROFILE=FLAGS, e.g. "
                             "'patched-router=--policy consistent_hashing'.", ExitCode.USAGE)
        extra.setdefault(name, []).append(shlex.split(flags))
    load = workload.AgentWorkload(sessions=args.agent_sessions, turns=args.agent_turns)
    data = routing_bench.run(args.profiles, load,
                             prefill_us=routing_bench.PREFILL_US_PER_TOKEN if args.prefill_us_per_token is None
                             else args.prefill_us_per_token,
                             decode_us=routing_bench.DECODE_US_PER_TOKEN if args.decode_us_per_token is None
                             else args.decode_us_per_token,
                             extra_modes=extra, progress=lambda m: print(m, file=sys.stderr))
    command = "polarstack bench" + ("" if len(sys.argv) <= 2 else " " + " ".join(sys.argv[2:]))
    paths = routing_bench.write_outputs(data, Path(args.out), command)
    if args.json:
        _print_json(data)
        return 0
    table = Table("profile", "routing mode", "prompt tok % per engine", "affinity %", "cache/ideal", "turns/s", "goals")
    rows = [("any", "Polar worker bypass", data["bypass"])] + [
        (name, m["label"] + (" (shipped)" if m["shipped"] else ""), m["metrics"])
        for name, row in data["profiles"].items() for m in row["modes"]]
    for name, label, m in rows:
        table.add_row(name, label, "/".join(f"{v * 100:.0f}" for v in m["prompt_token_share"]),
                      f"{m['session_affinity'] * 100:.1f}", f"{m['cache_vs_ideal']:.3f}", f"{m['turns_per_s']:.1f}",
                      "met" if all(m["goals"].values()) else "missed")
    console = _console()
    console.print(table)
    console.print(f"wrote {paths['markdown']}, {paths['json']}, {paths['plot']}")
    return 0


# --- verify-offline -----------------------------------------------------------------------------------------


def _add_verify_offline(sub) -> None:
    p = sub.add_parser("verify-offline", help="check every rendered command line and pin against the pinned upstreams")
    p.add_argument("--skip-downloads", action="store_true", help="do not resolve pins on the package index")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_verify_offline)


def _cmd_verify_offline(args: argparse.Namespace) -> int:
    from rich.table import Table

    from polarstack import verify_offline

    checks, elapsed = verify_offline.run(args.skip_downloads, progress=lambda m: print(f"verify-offline: {m}", file=sys.stderr))
    failed = [c for c in checks if not c.ok]
    if args.json:
        _print_json({"ok": not failed, "seconds": round(elapsed, 2),
                     "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "problems": c.problems} for c in checks]})
    else:
        table = Table("check", "result")
        for check in checks:
            table.add_row(check.name, "ok" if check.ok else "FAIL: " + "; ".join(check.problems)[:200])
        console = _console()
        console.print(table)
        console.print(f"{len(checks) - len(failed)}/{len(checks)} checks passed in {elapsed:.1f} s")
    if failed:
        raise StackError(failed[0].problems[0] if failed[0].problems else failed[0].name, ExitCode.USAGE)
    return 0


# --- routers ----------------------------------------------------------------------------------------------


def _add_routers(sub) -> None:
    p = sub.add_parser("routers", help="router releases: catalog, install")
    rsub = p.add_subparsers(dest="routers_cmd", required=True, metavar="{catalog,install,matrix}")
    mat = rsub.add_parser("matrix", help="measure router releases in front of the emulator (issue #52's bisection)")
    mat.add_argument("--releases", nargs="+", metavar="PACKAGE==VERSION", default=None,
                     help="releases to sweep (default: sglang-router 0.1.0-0.3.2 and every smg release)")
    mat.add_argument("--json", dest="json_file", metavar="FILE", default=None, help="write the rows as JSON")
    mat.add_argument("--markdown", metavar="FILE", default=None, help="write a Markdown report")
    mat.add_argument("--latency-requests", type=int, default=200, help="requests each way for latency (default 200)")
    mat.set_defaults(handler=_cmd_routers_matrix)
    cat = rsub.add_parser("catalog", help="what each pinned/known release accepts and forwards")
    cat.add_argument("--json", action="store_true")
    cat.set_defaults(handler=_cmd_routers_catalog)
    ins = rsub.add_parser("install", help="install releases into their cached virtual environments")
    ins.add_argument("releases", nargs="+", metavar="PACKAGE==VERSION")
    ins.set_defaults(handler=_cmd_routers_install)


def _cmd_routers_catalog(args: argparse.Namespace) -> int:
    from rich.table import Table

    from polarstack.routers import MEASURED, RouterRelease, is_installed

    rows = []
    for package, version in sorted(MEASURED, key=lambda pv: (pv[0], tuple(int(x) for x in pv[1].split(".")))):
        rel = RouterRelease(package, version)
        rows.append({"release": rel.spec, "module": rel.module, "forwards_chat_return_flags": rel.forwards_unknown_chat_fields,
                     "worker_api": rel.has_worker_api, "startup_check_interval_flag": rel.accepts_startup_check_interval,
                     "prometheus_port_flag": rel.accepts_prometheus_port,
                     "prometheus_host_flag": rel.accepts_prometheus_host, "installed": is_installed(rel)})
    if args.json:
        _print_json(rows)
        return 0
    table = Table(*rows[0].keys())
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    _console().print(table)
    return 0


def _cmd_routers_matrix(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from polarstack import matrix
    from polarstack.routers import RouterRelease

    if args.latency_requests < 1:
        raise StackError("--latency-requests must be at least 1.", ExitCode.USAGE)
    releases = [RouterRelease.parse(s) for s in args.releases] if args.releases else matrix.default_releases()
    command = "polarstack routers matrix " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else "polarstack routers matrix"
    from rich.console import Console

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("router releases", total=len(releases))

        def advance(row):
            progress.update(task, advance=1, description=f"router releases (last: {row['release']})")

        rows = matrix.run_matrix(releases, args.latency_requests, on_row=advance)
    matrix.write_outputs(rows, args.json_file, args.markdown, command)
    table = Table(*(title for _, title in matrix.COLUMNS), "note")
    for row in rows:
        table.add_row(*(matrix.cell(row, key) for key, _ in matrix.COLUMNS), row.get("note", "")[:60])
    _console().print(table)
    return 0


def _cmd_routers_install(args: argparse.Namespace) -> int:
    from polarstack.routers import RouterRelease, install

    for spec in args.releases:
        print(install(RouterRelease.parse(spec), quiet=False))
    return 0


# --- main -------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polarstack", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"polarstack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_emulate_engine, _add_smoke, _add_probe, _add_up, _add_down, _add_status, _add_demo, _add_compose,
                _add_pin, _add_polar_switch, _add_tasks, _add_verify, _add_train, _add_bench,
                _add_verify_offline, _add_routers):
        add(sub)
    return parser


# Exit status when the reader of stdout goes away (`polarstack ... | head`): what a shell reports for a
# command killed by SIGPIPE (128 + 13), documented in the README's exit-code table.
BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a bad argument (2, USAGE)
        _name_code_for_make(int(exc.code or 0))
        raise
    _name_code_for_make(code)
    return code


def _name_code_for_make(code: int) -> None:
    """Under `make` (which sets POLARSTACK_VIA_MAKE), say the real exit code: make reports a failing recipe as
    `Error N` and itself always exits 2, so the code that names the failure would otherwise be lost."""
    if code and os.environ.get("POLARSTACK_VIA_MAKE"):
        print(f"polarstack exited with code {code} ({_code_name(code)}); make itself exits 2 - run "
              f".venv/bin/polarstack directly to get {code} as the exit status.", file=sys.stderr)


def _code_name(code: int) -> str:
    if code == BROKEN_PIPE:
        return "BROKEN_PIPE"
    try:
        return ExitCode(code).name
    except ValueError:
        return "interrupted" if code == 130 else "unknown"


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except BrokenPipeError:
        # Silence the interpreter's own flush at exit, which would hit the closed pipe again.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except StackError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"polarstack: {exc.message}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        print("polarstack: interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so in one line, traceback only with --debug
        if args.debug:
            traceback.print_exc()
        print(f"polarstack: internal error ({type(exc).__name__}: {exc}); rerun with --debug and report it.",
              file=sys.stderr)
        return int(ExitCode.INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
