"""`polarstack compose`: the docker runtime's verbs (render a profile for Compose v2 and drive it), behind `make`.

`make up|down|ps|logs|build|model|sif|clean` call these; the record of the profile that is up lives in
docker_state.
"""

from __future__ import annotations

import argparse
import sys

from polarstack.errors import ExitCode, StackError
from polarstack.stack import assets, compose, docker_state, profiles
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
    compose.check_node(args.verb, profile, need_gpus=need_gpus)
    if args.verb in ("up", "down"):  # profiles share service names: never act on X while Y runs
        docker_state.guard_other_profile(args.verb, profile)
    if args.verb == "up":  # weights, sandbox image and agent CLI before any engine starts (one sentence each)
        assets.check_before_up(profile)
        print("\n".join(memory.check_up(profile).lines()), file=sys.stderr)  # refuses a node too small for make train
    proc = compose.run_compose(profile, [*compose_args, *args.service])
    if proc.returncode != 0:
        raise StackError(
            f"docker compose {args.verb} failed for profile {profile.name} (exit {proc.returncode}); "
            "see the output above.",
            ExitCode.ENVIRONMENT,
        )
    if args.verb == "up":
        print(
            f"{profile.name} is up (state in {docker_state.write(profile)}); `make smoke` and `make train` use it.",
            file=sys.stderr,
        )
    elif args.verb == "down" and (docker_state.read() or {}).get("profile") in (None, profile.name):
        docker_state.clear()
    return 0
