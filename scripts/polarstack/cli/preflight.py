"""`polarstack preflight` (`make preflight`): the rehearsal's plan (--dry-run), its run on the node, its report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from polarstack.checks import rehearsal_report
from polarstack.cli.render import print_json, render_preflight_plan, render_rehearsal_report
from polarstack.errors import ExitCode, StackError
from polarstack.stack import compose, docker_state, profiles
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
        try:
            result = json.loads(Path(args.report).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise StackError(f"cannot read the report {args.report} ({exc}).", ExitCode.USAGE) from None
        _show(result, args.json)
        rehearsal_report.raise_on_failure(result)
        return 0
    profile = profiles.load(docker_state.profile_name(args.profile))
    if profile.expect != "pass":
        raise StackError(
            f"profile {profile.name} is diagnostic (its smoke fails by design); rehearse a working profile.",
            ExitCode.USAGE,
        )
    plan = preflight.build(profile, sets=list(args.set))
    problems = preflight.checks(plan)
    if problems:
        raise StackError(f"the rehearsal's plan is inconsistent: {problems[0]}.", ExitCode.USAGE)
    if args.dry_run:
        if args.json:
            print_json(plan.as_dict())
        else:
            render_preflight_plan(plan)
        return 0
    compose.check_node("preflight", profile, need_gpus=True)
    result = rehearsal_run.run(profile, plan)
    _show(result, args.json)
    rehearsal_report.raise_on_failure(result)
    return 0


def _show(result: dict, as_json: bool) -> None:
    if as_json:
        print_json({k: v for k, v in result.items() if k != "evidence"})
    else:
        render_rehearsal_report(result)
