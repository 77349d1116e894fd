"""The local runtime's commands: `up`, `down`, `status` (polarstack.stack.local) and `demo` (every profile in turn)."""

from __future__ import annotations

import argparse
import os
import sys

from polarstack.checks import docker_demo, shape_probe
from polarstack.checks.demo import run_demo
from polarstack.cli.render import (
    print_json,
    render_demo,
    render_docker_demo_note,
    render_local_up,
    render_status,
)
from polarstack.errors import ExitCode, StackError
from polarstack.inputs import seconds
from polarstack.processes import sigterm_as_interrupt
from polarstack.stack import local, real_sglang
from polarstack.stack.runtime import UpChecks, UpRequest


def _add_engine(p) -> None:
    p.add_argument(
        "--engine",
        choices=("emulator", "sglang"),
        default="emulator",
        help="emulator: the CPU stand-in (default, fast); sglang: the real pinned sglang on the CPU with a tiny "
        "random Qwen2 model (installed once under the cache: about 4.8 GB download, 4 GB of memory per engine)",
    )


def _add_up(sub) -> None:
    p = sub.add_parser("up", help="start a profile's topology (local: emulated engines + the real router)")
    p.add_argument("--profile", required=True, help="profile name (configs/profiles/<name>.env)")
    p.add_argument(
        "--runtime",
        choices=("local",),
        default="local",
        help="local: processes on 127.0.0.1 (the docker runtime is driven by `make up`)",
    )
    p.add_argument("--timeout", type=seconds, default=60.0, help="seconds to wait for each process (default 60)")
    _add_engine(p)
    p.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=0.0,
        help="emulated engines' prefill time per uncached prompt token (default 0: off; docs/routing.md)",
    )
    p.add_argument(
        "--decode-us-per-token",
        type=float,
        default=0.0,
        help="emulated engines' decode time per generated token (default 0: off)",
    )
    p.add_argument(
        "--wait-nodes",
        type=seconds,
        default=local.WAIT_NODES_SECONDS,
        help="NODES>1 (configs/cluster.env): seconds rank 0 waits for the other nodes' engines and Ray workers, and "
        f"a node of rank > 0 for the Ray head (default {local.WAIT_NODES_SECONDS:g})",
    )
    p.add_argument("--json", action="store_true", help="print the run state as JSON")
    p.set_defaults(handler=_cmd_up)


def _cmd_up(args: argparse.Namespace) -> int:
    profile = args.site.profile  # --profile, its stack settings resolved
    request = UpRequest(
        timeout=args.timeout,
        engine=args.engine,
        engine_args=tuple(local.service_time_args(args.prefill_us_per_token, args.decode_us_per_token)),
        wait_nodes=args.wait_nodes,
    )
    state = args.site.local().up(profile, request, UpChecks(verifier=lambda _: shape_probe.check_local()))
    if args.json:
        print_json(state.data)
    else:
        print(render_local_up(state, profile, args.site.cluster))
    return 0


def _add_down(sub) -> None:
    p = sub.add_parser("down", help="stop exactly what `up` started")
    p.add_argument(
        "--runtime",
        choices=("auto", "local", "docker"),
        default="local",
        help="local (default): what `polarstack up` started; docker: the profile `make up` started; auto (`make down`): "
        "the stack that is up, refused when two are",
    )
    p.add_argument("--profile", default=None, help="docker: the profile to stop (default: the one `make up` started)")
    p.set_defaults(handler=_cmd_down)


def _cmd_down(args: argparse.Namespace) -> int:
    runtime = args.site.runtime_to_stop(args.runtime)  # auto: the stack that is up, refused when two are
    runtime.down(args.site.profile if runtime.name == "docker" else None)
    return 0


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="what the local runtime has up")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    status = args.site.local().status()
    if args.json:
        print_json(status.data)
    elif status.state is None:
        print("nothing is up locally.")
    else:
        render_status(status.state)
    return 0


# --- demo -------------------------------------------------------------------------------------------------


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="every profile up locally in turn, smoke, a table; exit 0 if all as expected")
    p.add_argument("--profiles", nargs="+", default=None, help="subset of profiles (default: all four)")
    _add_engine(p)
    p.add_argument(
        "--runtime",
        choices=("local", "docker"),
        default="local",
        help="local: processes on 127.0.0.1; docker: real sglang in containers (DEVICE=cpu, the Docker engine at "
        "DOCKER_HOST)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    import time

    if args.runtime == "docker":
        return _cmd_docker_demo(args)
    started = time.perf_counter()
    rows = run_demo(args.profiles, progress=lambda m: print(m, file=sys.stderr), engine=args.engine)
    elapsed = time.perf_counter() - started
    if args.json:
        print_json({"rows": rows, "elapsed_seconds": round(elapsed, 2), "engine": args.engine})
    else:
        render_demo(rows, elapsed, engine=args.engine)
    return _demo_verdict(rows)


def _cmd_docker_demo(args: argparse.Namespace) -> int:
    sigterm_as_interrupt()  # the demo's stack is taken down, like after Ctrl-C
    result = docker_demo.run_demo(
        args.profiles,
        lambda m: print(m, file=sys.stderr),
        site=args.site,
        docker_host=os.environ.get("DOCKER_HOST"),  # the engine every docker and Compose command here talks to
        project=os.environ.get("POLARSTACK_DEMO_PROJECT"),  # the demo's own Compose project (default DEMO_PROJECT)
    )
    if args.json:
        print_json(result)
    else:
        render_demo(result["rows"], result["elapsed_seconds"], engine=f"{real_sglang.spec()} in Docker containers")
        render_docker_demo_note(result)
    return _demo_verdict(result["rows"])


def _demo_verdict(rows) -> int:
    wrong = [row for row in rows if not row["as_expected"]]
    if wrong:
        row = wrong[0]
        raise StackError(
            f"profile {row['profile']} gave {row['verdict']} where {row['expected']} was expected: {row['message']}",
            ExitCode.GATE if row["expected"] == "pass" else ExitCode.INVARIANT,
        )
    return 0


# --- the real engine's install ---------------------------------------------------------------------------------------


def _add_sglang_install(sub) -> None:
    p = sub.add_parser(
        "sglang-install",
        help="install the real pinned sglang (CPU) and build its tiny model once, under the cache; print what it cost",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_sglang_install)


def _cmd_sglang_install(args: argparse.Namespace) -> int:
    model = real_sglang.prepare(progress=lambda m: print(m, file=sys.stderr))
    data = {"spec": real_sglang.spec(), "venv": str(real_sglang.venv_dir()), "model": str(model)}
    data.update(real_sglang.install_stats())
    if args.json:
        print_json(data)
    else:
        print(f"{data['spec']} is installed in {data['venv']}; tiny model in {data['model']}")
    return 0


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_up(sub)
    _add_down(sub)
    _add_status(sub)
    _add_demo(sub)
    _add_sglang_install(sub)
