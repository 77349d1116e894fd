"""`make up` faults on a real Docker engine, each refused or reported in one sentence (README, "Failure modes"):

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
from polarstack.stack import compose, device, docker_state, ports
from polarstack.stack.profiles import knob


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
