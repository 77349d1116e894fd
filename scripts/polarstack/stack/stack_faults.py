"""`make up` faults on a real Docker engine, each refused or reported in one sentence (docs/docker-cpu.md, "Faults"):

- `make up` twice: the profile's record is there and its services run -> exit 0 saying so, nothing recreated;
- a port of the stack already taken on 127.0.0.1 (every service uses host networking, so a server that cannot bind
  would only show up as a healthcheck that never passes, minutes later) -> STATE, naming the port and its knob;
- a healthcheck that never passes, or a service that exits, during `up --wait` -> ENVIRONMENT, naming the service,
  its start period and `make logs SERVICE=...` (the containers stay for the logs; `make down` removes them);
- Ctrl-C (or SIGTERM) during `make up`: what it started is taken down and nothing is recorded, then exit 130.
"""

from __future__ import annotations

import sys

from polarstack.errors import ExitCode, StackError
from polarstack.processes import port_taken, shielded
from polarstack.stack import compose, device, docker_state
from polarstack.stack.profiles import knob, stack_knobs


def already_up(profile, record) -> bool:
    """`make up` twice: True (and one sentence) when this profile's record is there and all its services run;
    then nothing is started or recreated. A record whose stack stopped is started again."""
    if record is None or record.get("profile") != profile.name or docker_state.not_running(profile):
        return False
    print(
        f"polarstack: profile {profile.name} is already up under Docker ({device.project()}); nothing started or "
        "recreated (`make down` first to start it afresh).",
        file=sys.stderr,
    )
    return True


def stack_ports(profile) -> list[tuple[int, str, str]]:
    """Every port the profile's services bind on 127.0.0.1: (port, what, the knob that moves it)."""
    ports = [(profile.engine_port(i), f"engine-{i}", "ENGINE_PORT_BASE") for i in range(profile.engine_count)]
    if profile.router is not None:
        ports += [
            (profile.router_port, "router", "ROUTER_PORT"),
            (profile.router_port + 1, "router metrics", "ROUTER_PORT"),
        ]
    knobs = stack_knobs()
    for key, what in (("RAY_GCS_PORT", "the trainer's Ray GCS"), ("RAY_DASHBOARD_PORT", "the trainer's Ray dashboard")):
        ports.append((int(knob(profile, key) or knobs.get(key) or 0), what, key))
    return [p for p in ports if p[0]]


def refuse_taken_ports(profile) -> None:
    """STATE naming the first port of the profile a server could not listen on (probed as the servers bind:
    processes.port_taken, so what `make down` left in TIME_WAIT does not count)."""
    for port, what, key in stack_ports(profile):
        try:
            taken = port_taken(port)
        except OSError as exc:
            raise StackError(
                f"port {port} ({what} of profile {profile.name}) cannot be bound on 127.0.0.1 ({exc.strerror}); "
                f"move the stack with {key}=<another port>.",
                ExitCode.ENVIRONMENT,
            ) from None
        if taken:
            raise StackError(
                f"port {port} ({what} of profile {profile.name}) is already taken on 127.0.0.1, and every service "
                f"uses host networking; stop what listens there, or move the stack with {key}=<another port>.",
                ExitCode.STATE,
            )


def take_down_after_interrupt(profile) -> None:
    """Ctrl-C during `make up`: remove this profile's containers (shielded from a second Ctrl-C), forget its record."""
    with shielded():
        compose.run_compose(profile, ["down", "--remove-orphans"], capture=True)
        if (docker_state.read() or {}).get("profile") == profile.name:
            docker_state.clear()
    print(f"polarstack: interrupted: took down what `make up` had started for profile {profile.name}.", file=sys.stderr)


def why_up_failed(profile, returncode: int) -> StackError:
    """The sentence for a failed `compose up --wait`: which service never became healthy or exited."""
    try:
        states = docker_state.service_states(profile)
    except StackError:
        states = {}
    unhealthy = sorted(name for name, state in states.items() if state == "unhealthy")
    exited = sorted(
        name for name, state in states.items() if state in ("exited", "dead") and name not in docker_state.ONE_SHOT
    )
    if unhealthy:
        name = unhealthy[0]
        period = knob(profile, "ENGINE_START_PERIOD") or "900s"
        start = f"start period ENGINE_START_PERIOD={period}" if name.startswith("engine-") else "its start period"
        interval = knob(profile, "HEALTHCHECK_INTERVAL") or "15s"  # compose.yaml's x-healthcheck-timing default
        return StackError(
            f"{', '.join(unhealthy)} of profile {profile.name} never passed its healthcheck ({start}, then 3 failed "
            f"checks {interval.removesuffix('s')} s apart); see `make logs SERVICE={name}`, then `make down`.",
            ExitCode.ENVIRONMENT,
        )
    if exited:
        return StackError(
            f"{', '.join(exited)} of profile {profile.name} exited during `make up`; see `make logs "
            f"SERVICE={exited[0]}`, then `make down`.",
            ExitCode.ENVIRONMENT,
        )
    return StackError(
        f"docker compose up failed for profile {profile.name} (exit {returncode}); see the output above.",
        ExitCode.ENVIRONMENT,
    )
