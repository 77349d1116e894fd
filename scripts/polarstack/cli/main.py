"""The `polarstack` command: argparse subcommands as `_add_<verb>` / `_cmd_<verb>` pairs.

Wiring only: each handler calls one module and hands its report to polarstack.cli.render (or print_json for --json).
Subcommand groups live in cli/local.py (up/down/status/demo), cli/docker.py (compose), cli/tasks.py (tasks, verify),
cli/bench.py (bench) and cli/routers.py (routers).

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
from dataclasses import replace
from typing import Callable

from polarstack import __version__
from polarstack.checks import docker_smoke, probe, smoke, tool_exchange
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.cli import bench as cli_bench
from polarstack.cli import cluster as cli_cluster
from polarstack.cli import docker as cli_docker
from polarstack.cli import local as cli_local
from polarstack.cli import preflight as cli_preflight
from polarstack.cli import routers as cli_routers
from polarstack.cli import site as cli_site
from polarstack.cli import tasks as cli_tasks
from polarstack.cli.render import (
    print_json,
    render_docker_smoke,
    render_probe,
    render_smoke,
    render_train_plan,
    render_verify_offline,
)
from polarstack.engine import tool_parser
from polarstack.engine.emulator import app, engine
from polarstack.errors import ExitCode, StackError
from polarstack.inputs import count, seconds, url
from polarstack.offline import verify as verify_offline
from polarstack.paths import TRAINER_RUN_DIR, tool_homes
from polarstack.polar import switch as polar_switch
from polarstack.stack import local, pin
from polarstack.stack import target as stack_target
from polarstack.train import image_facts
from polarstack.train import launch as train_launch

Handler = Callable[[argparse.Namespace], int]


# --- emulate-engine ---------------------------------------------------------------------------------------


def _add_emulate_engine(sub) -> None:
    p = sub.add_parser(
        "emulate-engine",
        help="serve an HTTP stand-in for one sglang engine (CPU only)",
        description="Answer like sglang at the pinned version, with its own protocol models.",
    )
    p.add_argument("--port", type=count(1, 65535), required=True, help="TCP port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--model", default=None, help="served model name (default Qwen2.5-7B-Instruct)")
    p.add_argument("--seed", type=int, default=0, help="seed for deterministic tokens and logprobs")
    p.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="parse tool calls into message.tool_calls as sglang does with this flag (Qwen format only)",
    )
    p.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        help="modelled prefill time per uncached prompt token, one request at a time (default 0: off)",
    )
    p.add_argument(
        "--decode-us-per-token",
        type=float,
        default=0.0,
        help="modelled decode time per generated token, requests overlap (default 0: off)",
    )
    p.set_defaults(handler=_cmd_emulate_engine)


def _cmd_emulate_engine(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise StackError(f"--port {args.port} is not a TCP port.", ExitCode.USAGE)
    parser = args.tool_call_parser
    if parser is not None:
        _check_emulator_parser(parser)
    for name in ("prefill_us_per_token", "decode_us_per_token"):
        if not 0 <= getattr(args, name) < 1e6:
            raise StackError(f"--{name.replace('_', '-')} must be between 0 and 1e6 microseconds.", ExitCode.USAGE)
    # Deferred: the emulator's server (fastapi, uvicorn) costs about 0.4 s at start-up, and only this command needs it.

    app.serve(
        args.port,
        host=args.host,
        model=args.model or engine.DEFAULT_MODEL,
        seed=args.seed,
        tool_call_parser=parser,
        prefill_us_per_token=args.prefill_us_per_token,
        decode_us_per_token=args.decode_us_per_token,
    )
    return 0


def _check_emulator_parser(parser: str) -> None:
    """USAGE unless `parser` is a tool-call parser of the pinned sglang that writes the Qwen format, the only one
    the emulator writes."""
    if parser not in tool_parser.parser_choices():
        raise StackError(
            f"--tool-call-parser {parser} is not a parser of the pinned sglang; choose one of "
            f"{', '.join(tool_parser.parser_choices())}.",
            ExitCode.USAGE,
        )
    if parser not in tool_parser.qwen25_names():
        raise StackError(
            f"--tool-call-parser {parser}: the emulator writes only the Qwen format "
            f"(sglang's Qwen25Detector); use {' or '.join(tool_parser.qwen25_names())}.",
            ExitCode.USAGE,
        )


# --- smoke ------------------------------------------------------------------------------------------------


def _add_smoke(sub) -> None:
    p = sub.add_parser(
        "smoke",
        help="prove the path yields trainable tokens before GRPO launches",
        description="Send Polar-shaped chat requests, extract token ids as Polar does, check invariants.",
    )
    p.add_argument(
        "--base-url",
        default=None,
        type=url,
        help="Polar's inference base URL (router or engine); default: the profile that is up locally",
    )
    SmokeOptions.add_arguments(p)  # the check's own flags: --model ... --polar-config, defaults written there
    p.add_argument(
        "--route",
        choices=("base", "polar"),
        default=None,
        help="base: every request to --base-url (older Polar); polar: resolve like current Polar's "
        "client (GET /workers, then straight to regular workers); default: the profile's "
        "POLAR_ROUTE when a profile is up, else base",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="check a profile of the docker runtime: its base URL, route and (for slime-registered "
        "routers) a temporary registration of its engines; with a profile up locally, it must be "
        "that one (exit 9 otherwise)",
    )
    p.add_argument(
        "--runtime",
        choices=("auto", "local", "docker"),
        default="auto",
        help="without --base-url: local (the run state of `polarstack up`), docker (--profile's ports), "
        "or auto (local when a profile is up locally, else docker)",
    )
    p.add_argument(
        "--in-trainer",
        action="store_true",
        help="run by `make smoke` inside the trainer container (docker runtime): check --profile's ports "
        "from there, with the installed Polar's second opinion; refused where Polar is not importable",
    )
    p.add_argument("--tool-fields", default=None, metavar="PATH", help=argparse.SUPPRESS)  # docker_smoke hands over
    p.add_argument("--tool-unscripted", default=None, help=argparse.SUPPRESS)  # ... DEVICE=cpu's scripted tool answer
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_cmd_smoke)


def _cmd_smoke(args: argparse.Namespace) -> int:
    # first: an unreadable --polar-config is the first thing said; the smoke's knobs are this environment's
    options = SmokeOptions.from_args(args, tool_exchange.knobs_from(os.environ))
    if args.in_trainer and (args.base_url is not None or args.profile is None):
        raise StackError(
            "--in-trainer takes --profile and no --base-url (`make smoke` passes them); run `make smoke` "
            "on the host instead.",
            ExitCode.USAGE,
        )
    site = args.site
    if args.base_url is None and args.runtime == "auto" and not args.in_trainer:
        site.refuse_two("smoke")  # the local stack and a docker one up: name both, act on neither
    target = stack_target.resolve_target(
        args.runtime, args.profile, args.base_url, route=args.route, verb="smoke", in_trainer=args.in_trainer, site=site
    )
    engines = _real_engines(args, target)
    if args.timeout is None and "timeout" in engines:  # without --timeout, what answers decides (to_argv passes it on)
        options = replace(options, timeout=engines["timeout"])
    if target.runtime == "docker" and not args.in_trainer:  # on the host (the record is checked): in the trainer
        return _smoke_via_trainer(args, options, target.loaded)
    if target.runtime == "docker":
        docker_smoke.check_inside_trainer(target.loaded, site.cpu, os.environ)  # the trainer's rendered environment
    report = smoke.run_smoke(_smoke_target(target, engines), options)
    if args.json:
        print_json(report.as_dict())
    else:
        render_smoke(report)
    if not report.ok:
        raise StackError(report.message, report.code)
    return 0


def _real_engines(args: argparse.Namespace, target: stack_target.Target) -> dict:
    """A stack of real engines: the scripted tool answer and the longer timeout (local: its run state; DEVICE=cpu: the
    record `make up` wrote, or inside the trainer what the host handed over); {} elsewhere."""
    found = local.smoke_options(target, args.site.local_state if target.local else None)
    if target.runtime == "docker":
        record = None if args.in_trainer else args.site.docker_record
        found = (
            docker_smoke.real_engine_options(args.in_trainer, args.tool_fields, args.tool_unscripted, record) or found
        )
    return found


def _smoke_target(target: stack_target.Target, site: dict) -> SmokeTarget:
    """What the smoke checks: the resolved target, with the real engines' scripted tool answer where there is one."""
    return SmokeTarget(
        target.base_url,
        route=target.route or "base",
        register=target.register,
        engine_urls=target.engine_urls,
        nodes=target.nodes,
        tool_fields=site.get("tool_fields"),
        tool_unscripted=site.get("tool_unscripted"),
    )


def _smoke_via_trainer(args: argparse.Namespace, options: SmokeOptions, profile) -> int:
    runtime = args.site.docker()
    result = docker_smoke.run_in_trainer(options, profile, runtime, route=args.route, record=args.site.docker_record)
    if args.json:
        print_json(result)
    else:
        render_docker_smoke(result, profile.name)
    if result["verdict"] != "pass":
        raise StackError(result["message"], ExitCode(result["exit_code"]))
    return 0


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
    report = probe.run_probe(args.direct, args.via, model=args.model, timeout=args.timeout)
    if args.json:
        print_json(report.as_dict())
    elif report.direct:
        render_probe(report)
    if report.code != ExitCode.OK:
        raise StackError(report.message, report.code)
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="GRPO with Polar on slime: render, gate with the smoke, launch")
    p.add_argument("--task", required=True, help="humaneval or mbpp")
    p.add_argument("--profile", default=None, help="profile (default: the one up locally, else engine-direct)")
    p.add_argument(
        "--runtime",
        choices=("auto", "local", "docker"),
        default="auto",
        help="auto: the local runtime when a profile is up there, else docker",
    )
    p.add_argument("--dry-run", action="store_true", help="print and validate every command and file; launch nothing")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override configs/train/defaults.yaml (dotted key), repeatable",
    )
    p.add_argument("--source", default=None, help="mbpp: a JSONL file in MBPP's schema instead of the Hub")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's last checkpoint (--load of its save dir); refused when there is none",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--without-rehearsal",
        action="store_true",
        help="docker runtime: launch without a passing `make preflight` record (make train ALLOW_NO_PREFLIGHT=1)",
    )
    p.set_defaults(handler=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    def show_plan(plan, runtime: str) -> None:
        if args.json:
            print_json({"runtime": runtime, **plan.as_dict()})
        else:
            render_train_plan(plan, args.task, plan.profile, runtime, TRAINER_RUN_DIR)

    return train_launch.run(
        train_launch.TrainRequest(
            task=args.task,
            profile=args.profile,
            runtime=args.runtime,
            dry_run=args.dry_run,
            sets=tuple(args.set),
            source=args.source,
            resume=args.resume,
            json=args.json,
            without_rehearsal=args.without_rehearsal,
            site=args.site,
        ),
        show_plan,
    )


# --- verify-offline -----------------------------------------------------------------------------------------


def _add_verify_offline(sub) -> None:
    p = sub.add_parser("verify-offline", help="check every rendered command line and pin against the pinned upstreams")
    p.add_argument("--skip-downloads", action="store_true", help="do not resolve pins on the package index")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_verify_offline)


def _cmd_verify_offline(args: argparse.Namespace) -> int:
    checks, elapsed = verify_offline.run(
        args.skip_downloads, progress=lambda m: print(f"verify-offline: {m}", file=sys.stderr), where=args.site
    )
    failed = [c for c in checks if not c.ok]
    if args.json:
        print_json(
            {
                "ok": not failed,
                "seconds": round(elapsed, 2),
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "problems": c.problems} for c in checks],
            }
        )
    else:
        render_verify_offline(checks, elapsed)
    if failed:
        raise StackError(failed[0].problems[0] if failed[0].problems else failed[0].name, ExitCode.USAGE)
    return 0


def _add_pin(sub) -> None:
    p = sub.add_parser("pin", help="resolve base-image tags in configs/pins.env to digests (needs a registry)")
    p.set_defaults(handler=_cmd_pin)


def _cmd_pin(args: argparse.Namespace) -> int:
    registry = os.environ.get(pin.REGISTRY_ENV, pin.REGISTRY)  # the registry to ask (tests: one that is not there)
    for key, value in pin.run_pin(registry, os.environ.get(pin.AUTH_ENV, pin.AUTH)).items():
        print(f"{key}={value}")
    return 0


def _add_polar_switch(sub) -> None:
    p = sub.add_parser("polar-switch", help="Polar's worker-discovery switch (POLAR_WORKER_DISCOVERY=on|off)")
    p.add_argument("action", choices=("install", "status"), help="install: write the .pth hook into site-packages")
    p.set_defaults(handler=_cmd_polar_switch)


def _cmd_polar_switch(args: argparse.Namespace) -> int:
    if args.action == "install":
        print(f"installed {polar_switch.install_pth()}")
        return 0
    print(f"{polar_switch.ENV}={'on' if polar_switch.discovery_enabled() else 'off'}")
    return 0


def _add_image_facts(sub) -> None:
    p = sub.add_parser(
        "image-facts",
        help="in the trainer image at build time: its Polar and slime's router say what configs/upstream records",
    )
    p.add_argument("--stage", required=True, help="the Dockerfile's UPSTREAM_STAGE: upstream (the node) or base (cpu)")
    p.add_argument("--json", action="store_true", help="print the checked facts as JSON")
    p.set_defaults(handler=_cmd_image_facts)


def _cmd_image_facts(args: argparse.Namespace) -> int:
    lines = image_facts.check(args.stage)
    if args.json:
        print(json.dumps({"stage": args.stage, "facts": lines}, indent=2))
    else:
        for line in lines:
            print(f"polarstack image-facts: {line}")
    return 0


# --- main -------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polarstack", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"polarstack {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for add in (
        _add_emulate_engine,
        _add_smoke,
        _add_probe,
        cli_local.add_commands,
        cli_docker.add_commands,
        _add_pin,
        _add_polar_switch,
        _add_image_facts,
        cli_tasks.add_commands,
        _add_train,
        cli_preflight.add_commands,
        cli_bench.add_commands,
        _add_verify_offline,
        cli_routers.add_commands,
        cli_cluster.add_commands,
    ):
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
        print(
            f"polarstack exited with code {code} ({_code_name(code)}); make itself exits 2 - run "
            f".venv/bin/polarstack directly to get {code} as the exit status.",
            file=sys.stderr,
        )


def _code_name(code: int) -> str:
    if code == BROKEN_PIPE:
        return "BROKEN_PIPE"
    try:
        return ExitCode(code).name
    except ValueError:
        return "interrupted" if code == 130 else "unknown"


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(words)
    args.command_words = words  # the command line as typed, for reports that record it (bench, routers matrix)
    # Progress lines must reach a pipe or a log file as they are printed (`make demo ENGINE=sglang | tee demo.log`
    # runs for minutes), not when an 8 KiB buffer fills or the command ends.
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)
    try:
        args.site = cli_site.build(getattr(args, "profile", None))  # the device, what is up, the profile (lazily)
        with cli_site.applied(args.site):  # the device's environment (the CPU stack's ports and model) for this command
            for key, value in tool_homes().items():  # docker, pip, npm, rustup's proxies: their homes not in HOME
                os.environ.setdefault(key, value)
            code = int(args.handler(args) or 0)
        # Output shorter than stdout's buffer reaches a closed pipe only at this flush: raise it here, where it is
        # turned into 141, not in the interpreter's flush at exit (exit 120 with "Exception ignored").
        sys.stdout.flush()
        return code
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
        print(
            f"polarstack: internal error ({type(exc).__name__}: {exc}); rerun with --debug and report it.",
            file=sys.stderr,
        )
        return int(ExitCode.INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
