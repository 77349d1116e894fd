"""`polarstack compose`: the docker runtime's verbs (render a profile for Compose v2 and drive it), behind `make`.

`make up|down|ps|logs|build|model|sif|clean` call these; the record of the profile that is up lives in
docker_state.
"""

from __future__ import annotations

import argparse
import sys

from polarstack.checks import shape_probe
from polarstack.cli import cluster as cli_cluster
from polarstack.errors import ExitCode, StackError
from polarstack.processes import sigterm_as_interrupt
from polarstack.stack import (
    assets,
    bases,
    cluster,
    compose,
    device,
    docker_state,
    dockerd,
    profiles,
    ray_auth,
    stack_faults,
)
from polarstack.train import memory

COMPOSE_VERBS = {  # verb: (compose arguments, needs GPUs)
    "up": (["up", "--detach", "--wait"], True),
    "down": (["down"], False),
    "ps": (["ps"], False),
    "logs": (["logs", "--tail", "200"], False),
    "build": (["build"], False),
}


def _add_compose(sub) -> None:
    p = sub.add_parser("compose", help="the docker runtime: render a profile for Compose v2 and drive it")
    p.add_argument(
        "verb",
        choices=("env", "config", *COMPOSE_VERBS, "clean", "model", "sif"),
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
    profile = profiles.load(docker_state.profile_name(args.profile))
    if args.verb == "sif" and device.is_cpu():
        raise StackError(
            "make sif runs only on the node (the sandbox needs node 22 and apptainer from GitHub); DEVICE=cpu's "
            "`make up` skips the sandbox check by name.",
            ExitCode.USAGE,
        )
    if args.verb == "down":
        return down(profile.name, args.service)
    if args.verb in ("model", "sif"):
        return compose.run_oneshot(args.verb, profile)
    if args.verb == "env":
        env_path, gpus_path = compose.render(profile)
        print(env_path)
        print(gpus_path)
        return 0
    if args.verb == "config":
        proc = compose.run_compose(profile, ["config"], capture=True)
        if proc.returncode != 0:
            raise StackError(f"Compose rejected profile {profile.name}: {compose.first_line(proc)}", ExitCode.USAGE)
        sys.stdout.write(proc.stdout)
        return 0
    if args.verb == "clean":
        compose.check_node("clean", profile, need_gpus=False)
        if not args.yes:
            if not sys.stdin.isatty():
                raise StackError(
                    "make clean deletes the models, checkpoints, weight-updates and logs volumes; "
                    "rerun in a terminal to confirm, or pass --yes.",
                    ExitCode.USAGE,
                )
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
    compose.check_node(args.verb, profile, need_gpus=need_gpus and not device.is_cpu())
    record = None
    if args.verb == "up":  # STATE: an earlier `make up` never finished and left its containers (stack_faults)
        stack_faults.refuse_unfinished_up(profile)
    if args.verb == "up":  # profiles share service names: never act on X while Y runs
        record = docker_state.guard_other_profile(args.verb, profile)
    if args.verb == "up":
        if stack_faults.already_up(profile, record):  # `make up` twice: nothing started or recreated
            here = cluster.load()
            if here.multi:  # but this node's report is written again, into the head's current session
                cli_cluster.after_up(profile, here)
            return 0
        stack_faults.refuse_taken_ports(profile)  # STATE: a port of the stack is taken (host networking)
    if args.verb in ("build", "up") and device.is_cpu():  # the CPU bases and the tiny model (cached)
        device.prepare(lambda line: print(line, file=sys.stderr))
    found = cluster.load()
    if args.verb == "up" and found.multi:  # the interface, Ray's token, SHARED_DIR (cli_cluster.before_up)
        cli_cluster.before_up(found)
    if args.verb == "up":  # weights, sandbox image and agent CLI before any engine starts (one sentence each)
        assets.check_before_up(profile)
        stack_faults.images_before_up(
            profile
        )  # ASSETS_MISSING naming `make build` (DEVICE=cpu: builds them, saying so)
        if device.is_cpu():  # the tiny model on the CPU: the estimate is the GPU node's, not this stack's
            print(
                "memory: not estimated for DEVICE=cpu (the tiny model on the CPU; the node's estimate: make train DRY_RUN=1)",
                file=sys.stderr,
            )
        else:
            print(
                "\n".join(memory.check_up(profile, nodes=found.nodes).lines()), file=sys.stderr
            )  # refuses a node too small for make train (per node at NODES>1)
        # The reward in the namespace shape of Polar's sessions, in the trainer image, before anything starts.
        shape_probe.check_docker(profile)
        if found.multi:  # every check passed: the head opens the session now, just before it starts anything
            cli_cluster.open_session(profile, found)
        sigterm_as_interrupt()  # a SIGTERM takes down what this `up` started, like Ctrl-C
        docker_state.write_unfinished(profile)  # until `write` below: the next `make up` refuses, `make down` finds it
        try:
            proc = compose.run_compose(profile, [*compose_args, *args.service])
        except KeyboardInterrupt:  # Ctrl-C half-way: nothing of this profile is left running or recorded
            stack_faults.take_down_after_interrupt(profile)
            raise
        if proc.returncode in (130, -2):  # Compose got the Ctrl-C (this process may have SIGINT ignored): the same
            stack_faults.take_down_after_interrupt(profile)
            raise KeyboardInterrupt
        if proc.returncode != 0:
            raise stack_faults.why_up_failed(profile, proc.returncode)
    else:
        proc = compose.run_compose(profile, [*compose_args, *args.service])
    if proc.returncode != 0:
        raise StackError(
            f"docker compose {args.verb} failed for profile {profile.name} (exit {proc.returncode}); "
            "see the output above.",
            ExitCode.ENVIRONMENT,
        )
    if args.verb == "up":
        extra = device.tool_record(profile.router) if device.is_cpu() else None  # real engines: a scripted tool answer
        print(
            f"{profile.name} is up (state in {docker_state.write(profile, extra=extra)}); `make smoke` and "
            "`make train` use it.",
            file=sys.stderr,
        )
        port = profiles.knob(profile, "RAY_DASHBOARD_PORT", "8265")
        print("\n".join(ray_auth.login_lines(compose.token_file(), port)), file=sys.stderr)  # the file, not the token
        if found.multi:  # this node's report; the cluster check once every node is up
            cli_cluster.after_up(profile, found)
    return 0


def down(profile_name: str | None, services: list[str] | tuple[str, ...] = ()) -> int:
    """`make down` of the docker runtime: the profile named, else the one up; refused while another profile runs."""
    profile = profiles.load(docker_state.profile_name(profile_name))
    compose.check_node("down", profile, need_gpus=False)
    record = docker_state.guard_other_profile("down", profile)  # profiles share service names: never stop Y for X
    if record is None and not docker_state.service_states(profile):
        print(
            f"nothing of profile {profile.name} is up under Docker ({device.project()}); nothing to stop.",
            file=sys.stderr,
        )
        return 0
    proc = compose.run_compose(profile, ["down", *services])
    if proc.returncode != 0:
        raise StackError(
            f"docker compose down failed for profile {profile.name} (exit {proc.returncode}); see the output above.",
            ExitCode.ENVIRONMENT,
        )
    if (docker_state.read() or {}).get("profile") in (None, profile.name):
        docker_state.clear()
    return 0


def _add_bases(sub) -> None:
    p = sub.add_parser("bases", help="DEVICE=cpu: make the CPU base images here (Debian + PyPI), never pulled")
    p.add_argument("--rebuild", action="store_true", help="rebuild even the bases that exist (and the Debian tree)")
    p.set_defaults(handler=_cmd_bases)


def _cmd_bases(args: argparse.Namespace) -> int:
    if not device.is_cpu():
        raise StackError(
            "make bases is for DEVICE=cpu (the node pulls its pinned bases, PYTHON_IMAGE and SLIME_IMAGE); run "
            "`make bases DEVICE=cpu`.",
            ExitCode.USAGE,
        )
    compose.check_node("bases", None, need_gpus=False)
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
