"""`polarstack routers`: the router releases' catalog, their installs, and the matrix that measures them."""

from __future__ import annotations

import argparse

from polarstack.bench import matrix
from polarstack.cli.render import print_json, progress_bar, render_matrix, render_routers_catalog
from polarstack.errors import ExitCode, StackError
from polarstack.processes import sigterm_as_interrupt
from polarstack.routers.catalog import MEASURED, RouterRelease
from polarstack.routers.harness import install, is_installed


def _add_routers(sub) -> None:
    p = sub.add_parser("routers", help="router releases: catalog, install")
    rsub = p.add_subparsers(dest="routers_cmd", required=True, metavar="{catalog,install,matrix}")
    mat = rsub.add_parser(
        "matrix", help="measure router releases in front of the emulator or the real sglang (issue #52's bisection)"
    )
    mat.add_argument(
        "--releases",
        nargs="+",
        metavar="PACKAGE==VERSION",
        default=None,
        help="releases to sweep (default: sglang-router 0.1.0-0.3.2 and every smg release)",
    )
    mat.add_argument("--json", dest="json_file", metavar="FILE", default=None, help="write the rows as JSON")
    mat.add_argument("--markdown", metavar="FILE", default=None, help="write a Markdown report")
    mat.add_argument(
        "--latency-requests",
        type=int,
        default=None,
        help="requests each way for latency (default 200; 20 with --engine sglang)",
    )
    mat.add_argument(
        "--engine",
        choices=matrix.ENGINES,
        default="emulator",
        help="the engine behind each router: the emulator (default) or the real pinned sglang on the CPU",
    )
    mat.add_argument(
        "--engine-url",
        default=None,
        metavar="URL",
        help="with --engine sglang: a real server already running on this machine, instead of starting one",
    )
    mat.set_defaults(handler=_cmd_routers_matrix)
    cat = rsub.add_parser("catalog", help="what each pinned/known release accepts and forwards")
    cat.add_argument("--json", action="store_true")
    cat.set_defaults(handler=_cmd_routers_catalog)
    ins = rsub.add_parser("install", help="install releases into their cached virtual environments")
    ins.add_argument("releases", nargs="+", metavar="PACKAGE==VERSION")
    ins.set_defaults(handler=_cmd_routers_install)


def _cmd_routers_catalog(args: argparse.Namespace) -> int:
    rows = []
    for package, version in sorted(MEASURED, key=lambda pv: (pv[0], tuple(int(x) for x in pv[1].split(".")))):
        rel = RouterRelease(package, version)
        rows.append(
            {
                "release": rel.spec,
                "module": rel.module,
                "forwards_chat_return_flags": rel.forwards_unknown_chat_fields,
                "worker_api": rel.has_worker_api,
                "startup_check_interval_flag": rel.accepts_startup_check_interval,
                "prometheus_port_flag": rel.accepts_prometheus_port,
                "prometheus_host_flag": rel.accepts_prometheus_host,
                "installed": is_installed(rel),
            }
        )
    if args.json:
        print_json(rows)
        return 0
    render_routers_catalog(rows)
    return 0


def _cmd_routers_matrix(args: argparse.Namespace) -> int:
    if args.latency_requests is None:  # each request waits for the real engine's forward pass: fewer by default
        args.latency_requests = 20 if args.engine == "sglang" else 200
    if args.latency_requests < 1:
        raise StackError("--latency-requests must be at least 1.", ExitCode.USAGE)
    sigterm_as_interrupt()  # the matrix's engines and relays are stopped by engines_for's `finally`
    releases = [RouterRelease.parse(s) for s in args.releases] if args.releases else matrix.default_releases()
    words = args.command_words  # the command line as typed (cli._main sets it)
    command = "polarstack routers matrix " + " ".join(words[2:]) if len(words) > 2 else "polarstack routers matrix"
    with progress_bar() as progress:
        task = progress.add_task("router releases", total=len(releases))

        def advance(row):
            progress.update(task, advance=1, description=f"router releases (last: {row['release']})")
            if not progress.console.is_terminal:  # a log file gets no live bar: one line per release instead
                done = int(progress.tasks[0].completed)
                progress.console.print(f"routers matrix: {done}/{len(releases)} {row['release']} measured")

        rows = matrix.run_matrix(
            releases,
            args.latency_requests,
            on_row=advance,
            engine=args.engine,
            progress=progress.console.print,
            engine_url=args.engine_url,
            settings=args.site.settings,  # the stack's SERVED_MODEL_NAME and tool-call parser, as the site read them
        )
    matrix.write_outputs(rows, args.json_file, args.markdown, command, args.engine)
    render_matrix(rows)
    return 0


def _cmd_routers_install(args: argparse.Namespace) -> int:
    for spec in args.releases:
        print(install(RouterRelease.parse(spec)))
    return 0


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_routers(sub)
