"""`polarstack preflight` (`make preflight`): the rehearsal's plan (--dry-run), its run on the node, its report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polarstack.checks import rehearsal_report, shape_probe
from polarstack.cli import cluster as cli_cluster
from polarstack.cli import site as cli_site
from polarstack.cli.render import print_json, render_preflight_plan, render_rehearsal_report
from polarstack.errors import ExitCode, StackError
from polarstack.stack import compose
from polarstack.train import preflight, rehearsal_run


def _add_preflight(sub) -> None:
    p = sub.add_parser(
        "preflight", help="rehearse the whole real stack at toy scale on the node (small model, tiny GRPO run)"
    )
    p.add_argument("--profile", default=None, help="profile (default: the one recorded up, else engine-direct)")
    p.add_argument("--dry-run", action="store_true", help="print and validate the rehearsal's launch; run nothing")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the rehearsal's configs/train/defaults.yaml keys (dotted), repeatable",
    )
    p.add_argument("--report", default=None, metavar="PATH", help="show a rehearsal-report.json again")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_cmd_preflight)


def _cmd_preflight(args: argparse.Namespace) -> int:
    if args.report:
        result = _read_report(args.report)
    else:
        request = preflight.PreflightRequest(profile=args.profile, sets=tuple(args.set))
        profile, plan = preflight.checked_plan(request, args.site)
        if args.dry_run:
            _show_plan(plan, args.json)
            return 0
        result = _rehearse(profile, plan, args.site)
    _show(result, args.json)
    rehearsal_report.raise_on_failure(result)
    return 0


def _read_report(path: str) -> dict:
    """A rehearsal-report.json shown again (--report)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StackError(f"cannot read the report {path} ({exc}).", ExitCode.USAGE) from None


def _rehearse(profile, plan: preflight.PreflightPlan, site: cli_site.Site) -> dict:
    """The rehearsal on this node (the site's device and cluster): the node's checks, then
    polarstack.train.rehearsal_run; its report."""
    compose.check_node("preflight", profile, need_gpus=True, where=site)
    rehearsal_run.refuse_if_up(site)  # STATE first: the rehearsal brings the stack up itself
    shape_probe.check_docker(profile, site)  # the reward in Polar's namespace shape, before anything comes up
    if plan.cluster.multi:  # the interface, Ray's token and SHARED_DIR on this node before the head comes up
        cli_cluster.before_up(plan.cluster)
    print("\n".join(plan.phases[0][1].memory.lines()), file=sys.stderr)  # computed (polarstack.train.memory)
    return rehearsal_run.run(profile, plan, site)


def _show_plan(plan: preflight.PreflightPlan, as_json: bool) -> None:
    if as_json:
        print_json(plan.as_dict())
    else:
        render_preflight_plan(plan)


def _show(result: dict, as_json: bool) -> None:
    if as_json:
        print_json({k: v for k, v in result.items() if k != "evidence"})
    else:
        render_rehearsal_report(result)


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_preflight(sub)
