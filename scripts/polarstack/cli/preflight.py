"""`polarstack preflight` (`make preflight`): the rehearsal's plan (--dry-run), its run on the node, its report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polarstack.checks import rehearsal_report, shape_probe
from polarstack.cli import cluster as cli_cluster
from polarstack.cli.render import print_json, render_preflight_plan, render_rehearsal_report
from polarstack.errors import ExitCode, StackError
from polarstack.stack import assets, compose, docker_state, profiles
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
    refuse_model_dir()
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
    rehearsal_run.refuse_if_up()  # STATE first: the rehearsal brings the stack up itself
    shape_probe.check_docker(profile)  # the reward in Polar's namespace shape, before the rehearsal brings anything up
    if plan.cluster.multi:  # the interface, Ray's token and SHARED_DIR on this node before the head comes up
        cli_cluster.before_up(plan.cluster)
    print("\n".join(plan.phases[0][1].memory.lines()), file=sys.stderr)  # computed (polarstack.train.memory)
    result = rehearsal_run.run(profile, plan)
    _show(result, args.json)
    rehearsal_report.raise_on_failure(result)
    return 0


def refuse_model_dir() -> None:
    """MODEL_DIR binds the host's weights at MODEL_PATH for `make up`, and `make model` downloads nothing while it is
    set: the rehearsal's engines would load them (the 7B) where the small model belongs (issue 26 point 6)."""
    host = assets.model_dir()
    if host is not None:
        raise StackError(
            f"make preflight rehearses with the small model from the models volume, but MODEL_DIR={host} would mount "
            "the host's weights in its place and make model would not download it: unset MODEL_DIR for make "
            "preflight and its make model, and set it again for make up and make train.",
            ExitCode.USAGE,
        )


def _show(result: dict, as_json: bool) -> None:
    if as_json:
        print_json({k: v for k, v in result.items() if k != "evidence"})
    else:
        render_rehearsal_report(result)


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_preflight(sub)
