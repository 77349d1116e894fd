"""`polarstack compose`: the docker runtime's verbs (render a profile for Compose v2 and drive it), behind `make`.

`make up|down|ps|logs|build|model|sif|clean` call these; the record of the profile that is up lives in
docker_state.
"""

from __future__ import annotations

import argparse
import sys

from polarstack.checks import shape_probe
from polarstack.cli import cluster as cli_cluster
from polarstack.cli import site as cli_site
from polarstack.errors import ExitCode, StackError
from polarstack.stack import bases, compose, dockerd
from polarstack.stack.runtime import UpChecks, UpRequest
from polarstack.train import cluster_up, memory


def _add_compose(sub) -> None:
    p = sub.add_parser("compose", help="the docker runtime: render a profile for Compose v2 and drive it")
    p.add_argument(
        "verb",
        choices=("env", "config", "up", "down", "ps", "logs", "build", "clean", "model", "sif"),
        help="env: render .run/compose/<profile>.env and .gpus.yaml; config: the rendered Compose model; "
        "model: download the weights into the models volume; sif: build the agent sandbox image",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="profile name (configs/profiles/<name>.env); default: the one `make up` started, else engine-direct",
    )
    p.add_argument("--yes", action="store_true", help="clean: do not ask before removing the volumes")
    p.add_argument("--service", action="append", default=[], help="limit to a service (repeatable; logs, ps, build)")
    p.set_defaults(handler=_cmd_compose)


def _cmd_compose(args: argparse.Namespace) -> int:
    docker, profile, verb = args.site.docker(), args.site.profile, args.verb
    if verb in ("model", "sif"):
        return docker.oneshot(verb, profile)
    if verb == "env":
        print("\n".join(map(str, docker.render(profile))))
    elif verb == "config":
        sys.stdout.write(docker.config(profile))
    elif verb == "clean":
        return docker.clean(profile, confirm=lambda: _confirm_clean(args.yes))
    elif verb == "up":
        docker.up(profile, UpRequest(services=tuple(args.service)), up_checks(args.site))
    elif verb == "down":
        docker.down(profile, args.service)
    elif verb == "ps":
        return docker.status(profile, args.service).code
    else:
        return docker.run_verb(verb, profile, args.service)
    return 0


def _confirm_clean(yes: bool) -> bool:
    """`make clean` deletes the volumes: --yes, else a "y" typed in a terminal (USAGE without one)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise StackError(
            "make clean deletes the models, checkpoints, weight-updates and logs volumes; "
            "rerun in a terminal to confirm, or pass --yes.",
            ExitCode.USAGE,
        )
    answer = input("Delete the volumes models, checkpoints, weight-updates and logs? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def up_checks(site: cli_site.Site) -> UpChecks:
    """The checks of the docker runtime's `make up` from the layers above stack/ (DockerRuntime.up runs them), on the
    site's device and cluster."""
    return UpChecks(
        # the reward in the namespace shape of Polar's sessions, in the trainer
        verifier=lambda profile: shape_probe.check_docker(profile, site),
        memory=lambda profile, count: memory.check_up(profile, nodes=count).lines(),
        nodes=cluster_up.NodeSteps(show=cli_cluster.render_cluster_check),
    )


def _add_bases(sub) -> None:
    p = sub.add_parser("bases", help="DEVICE=cpu: make the CPU base images here (Debian + PyPI), never pulled")
    p.add_argument("--rebuild", action="store_true", help="rebuild even the bases that exist (and the Debian tree)")
    p.set_defaults(handler=_cmd_bases)


def _cmd_bases(args: argparse.Namespace) -> int:
    if not args.site.cpu:
        raise StackError(
            "make bases is for DEVICE=cpu (the node pulls its pinned bases, PYTHON_IMAGE and SLIME_IMAGE); run "
            "`make bases DEVICE=cpu`.",
            ExitCode.USAGE,
        )
    compose.check_node("bases", None, need_gpus=False, where=args.site)
    for ref in bases.make_all(rebuild=args.rebuild):
        print(ref)
    return 0


def _add_dockerd(sub) -> None:
    p = sub.add_parser("dockerd", help="a private Docker engine for this machine (never the system daemon)")
    p.add_argument("action", choices=("start", "stop", "env"), help="env: print its DOCKER_HOST=... line")
    p.set_defaults(handler=_cmd_dockerd)


def _cmd_dockerd(args: argparse.Namespace) -> int:
    if args.action == "start":
        d = dockerd.start()
    elif args.action == "stop":
        dockerd.stop()
        return 0
    else:
        d = dockerd.daemon()
    print(f"DOCKER_HOST={d.host}")
    return 0


def add_commands(sub) -> None:
    """This module's subcommands, in the order `polarstack --help` lists them."""
    _add_compose(sub)
    _add_bases(sub)
    _add_dockerd(sub)
