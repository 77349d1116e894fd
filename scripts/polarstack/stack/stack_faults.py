"""`make up` faults on a real Docker engine, each refused or reported in one sentence (docs/docker-cpu.md, "Faults"):

- `make up` twice: the profile's record is there and its services run -> exit 0 saying so, nothing recreated;
- `make up` after one whose `compose up --wait` never finished (an engine unhealthy, a timeout, the terminal closed):
  its record is still unfinished (docker_state.write_unfinished) and its containers are there -> STATE, naming what is
  left and `make down`, instead of starting them over silently or refusing on the ports they hold;
- a port of the stack already taken on 127.0.0.1 (every service uses host networking, so a server that cannot bind
  would only show up as a healthcheck that never passes, minutes later) -> STATE, naming the port and its knob;
- a healthcheck that never passes, or a service that exits, during `up --wait` -> ENVIRONMENT, naming the service,
  its start period and `make logs SERVICE=...` (the containers stay for the logs; `make down` removes them);
- Ctrl-C (or SIGTERM) during `make up`: what it started is taken down and nothing is recorded, then exit 130;
- an image of the profile not built (`make build` skipped): Compose would build it unasked, for tens of minutes and
  first inside the shape probe's captured `compose run` (no progress at all), or try to pull it from a registry ->
  ASSETS_MISSING naming the images and `make build` (DEVICE=cpu, whose `make up` builds: says what, then builds it).
"""

from __future__ import annotations

import json
import subprocess
import sys

from polarstack.errors import ExitCode, StackError
from polarstack.processes import port_taken, shielded
from polarstack.stack import compose, device, docker_state, ports, profiles


def already_up(profile, record, where: compose.Where) -> bool:
    """`make up` twice: True (and one sentence) when this profile's record is there and all its services run;
    then nothing is started or recreated. A record whose stack stopped is started again. `where`: the site's device
    and cluster, as for every function here."""
    if record is None or record.get("profile") != profile.name or docker_state.not_running(profile, where):
        return False
    print(
        f"polarstack: profile {profile.name} is already up under Docker ({device.project(where.cpu)}); nothing "
        f"started or recreated (`make down{device.make_words(where.cpu)}` first to start it afresh).",
        file=sys.stderr,
    )
    return True


def refuse_unfinished_up(profile, state: dict | None, where: compose.Where) -> None:
    """Before `make up`: STATE when the record (`state`, as the caller's site read it) is of a `make up` that never
    finished and its containers are still there (any state: `compose ps --all` lists every container of the project,
    orphans included); a record none of whose containers is left (Compose failed before creating any) is forgotten."""
    if state is None or not docker_state.unfinished(state):
        return
    up, cpu = state["profile"], where.cpu
    left = docker_state.service_states(profiles.load(up), where)
    if not left:
        docker_state.clear(cpu=cpu)
        print(
            f"polarstack: forgot the record of an unfinished `make up PROFILE={up}`: none of its containers is left.",
            file=sys.stderr,
        )
        return
    listed = ", ".join(f"{name} ({left[name]})" for name in sorted(left))
    raise StackError(
        f"an earlier `make up PROFILE={up}` did not finish and left {listed} under Docker ({device.project(cpu)}); "
        f"run `make down{device.make_words(cpu)}` (it stops profile {up}) first, then `make up PROFILE={profile.name}"
        f"{device.make_words(cpu)}`.",
        ExitCode.STATE,
    )


def stack_ports(profile) -> list[tuple[int, str, str | None]]:
    """Every port the profile's services bind on 127.0.0.1 with a fixed number: (port, what, the knob that moves it or
    None), the trainer's Ray head's included (polarstack.stack.ports: its client server, dashboard agent and metrics
    ports, which no knob moves)."""
    return [(p.port, p.what, p.knob) for p in ports.node_ports(profile)]


def refuse_taken_ports(profile) -> None:
    """STATE naming the first port of the profile a server could not listen on (probed as the servers bind:
    processes.port_taken, so what `make down` left in TIME_WAIT does not count)."""
    for port, what, key in stack_ports(profile):
        move = (
            f"move the stack with {key}=<another port>" if key else f"it is one of ray's fixed ports ({ports.RECORD})"
        )
        try:
            taken = port_taken(port)
        except OSError as exc:
            raise StackError(
                f"port {port} ({what} of profile {profile.name}) cannot be bound on 127.0.0.1 ({exc.strerror}); "
                f"{move}.",
                ExitCode.ENVIRONMENT,
            ) from None
        if taken:
            raise StackError(
                f"port {port} ({what} of profile {profile.name}) is already taken on 127.0.0.1, and every service "
                f"uses host networking; stop what listens there{', or ' + move if key else ' (' + move + ')'}.",
                ExitCode.STATE,
            )


def take_down_after_interrupt(profile, where: compose.Where) -> None:
    """Ctrl-C during `make up`: remove this profile's containers (shielded from a second Ctrl-C), forget its record."""
    with shielded():
        compose.run_compose(profile, ["down", "--remove-orphans"], where=where, capture=True)
        docker_state.forget(profile.name, cpu=where.cpu)
    print(f"polarstack: interrupted: took down what `make up` had started for profile {profile.name}.", file=sys.stderr)


def why_up_failed(profile, returncode: int, where: compose.Where) -> StackError:
    """The sentence for a failed `compose up --wait`: which service never became healthy or exited."""
    dev = device.make_words(where.cpu)  # the advice names the CPU stack's DEVICE=cpu
    try:
        states = docker_state.service_states(profile, where)
    except StackError:
        states = {}
    unhealthy = sorted(name for name, state in states.items() if state == "unhealthy")
    exited = sorted(
        name for name, state in states.items() if state in ("exited", "dead") and name not in docker_state.ONE_SHOT
    )
    if unhealthy:
        name = unhealthy[0]
        period = profile.setting("ENGINE_START_PERIOD") or "900s"
        start = f"start period ENGINE_START_PERIOD={period}" if name.startswith("engine-") else "its start period"
        interval = profile.setting("HEALTHCHECK_INTERVAL") or "15s"  # compose.yaml's x-healthcheck-timing default
        return StackError(
            f"{', '.join(unhealthy)} of profile {profile.name} never passed its healthcheck ({start}, then 3 failed "
            f"checks {interval.removesuffix('s')} s apart); see `make logs SERVICE={name}{dev}`, then "
            f"`make down{dev}`.",
            ExitCode.ENVIRONMENT,
        )
    if exited:
        return StackError(
            f"{', '.join(exited)} of profile {profile.name} exited during `make up`; see `make logs "
            f"SERVICE={exited[0]}{dev}`, then `make down{dev}`.",
            ExitCode.ENVIRONMENT,
        )
    return StackError(
        f"docker compose up failed for profile {profile.name} (exit {returncode}); see the output above.",
        ExitCode.ENVIRONMENT,
    )


def profile_images(profile, where: compose.Where) -> dict[str, str]:
    """Service -> the image Compose uses for it in `profile`: `compose config --format json` of the files `make up`
    passes (every service the profile enables, DEVICE=cpu's and NODES>1's overrides included)."""
    proc = compose.run_compose(profile, ["config", "--format", "json"], where=where, capture=True)
    if proc.returncode != 0:
        raise StackError(f"Compose rejected profile {profile.name}: {compose.first_line(proc)}", ExitCode.USAGE)
    try:
        services = json.loads(proc.stdout)["services"]
    except (ValueError, KeyError, TypeError):
        raise StackError(
            f"`docker compose config --format json` printed no services for profile {profile.name}; check the Compose "
            "install with `docker compose version`.",
            ExitCode.ENVIRONMENT,
        ) from None
    return {name: svc["image"] for name, svc in sorted(services.items()) if isinstance(svc.get("image"), str)}


def _image_exists(image: str) -> bool:
    try:
        proc = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def images_before_up(profile, where: compose.Where, *, say=lambda line: print(line, file=sys.stderr)) -> None:
    """Before the shape probe and `compose up`: every image of the profile must be there. On the node, ASSETS_MISSING
    naming the missing ones and `make build`; on DEVICE=cpu (whose `make up` builds, README) a line naming them, then
    `compose build` of those services with its progress. `where`: the caller's site (its device: DEVICE=cpu)."""
    missing = {service: image for service, image in profile_images(profile, where).items() if not _image_exists(image)}
    if not missing:
        return
    listed = ", ".join(f"{image} ({service})" for service, image in missing.items())
    if where.cpu:
        say(f"polarstack: make up DEVICE=cpu builds {listed} first (from the CPU bases; later runs reuse them).")
        proc = compose.run_compose(profile, ["build", *missing], where=where)
        if proc.returncode != 0:
            raise StackError(
                f"docker compose build failed for {', '.join(missing)} of profile {profile.name} (exit "
                f"{proc.returncode}); see the output above.",
                ExitCode.ENVIRONMENT,
            )
        return
    raise StackError(
        f"make up PROFILE={profile.name} needs {listed}, not built on this node: run `make build PROFILE={profile.name}` "
        "first (`make up` builds no image: Compose would build them for tens of minutes without progress, or try to "
        "pull them from a registry).",
        ExitCode.ASSETS_MISSING,
        details=sorted(missing),
    )
