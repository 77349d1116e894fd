"""Run state of the docker runtime: which profile `make up` started, so smoke/train/down default to it.

The local runtime keeps its topology in .run/state.json (polarstack.stack.local); the docker runtime keeps
.run/docker-state.json, written as unfinished just before `docker compose up --wait` (`write_unfinished`), completed
once it succeeds, and removed by `make down` / `make clean`.
Without it, `make smoke` / `make train` after `make up PROFILE=patched-router` fell back to engine-direct and
asked Ray for GPUs that profile does not give the trainer.

A record is trusted only while it is true (issue 12 points 8-9, as local.LocalState.usable does for the local
runtime): `usable` refuses (STATE, one sentence naming the fix) when another profile was asked for than the one up,
when the record is half-written or its profile file changed since `make up`, and when a long-running service of
the recorded profile is not running (`compose ps --all --format json`). Every profile shares the Compose project
`polarstack` and the service names engine-0 / trainer, so `make up` / `make down` of another profile would act on
the stack that is up: `guard_other_profile` refuses them while any of its containers runs, and replaces a record
none of whose containers runs. A `make demo` keeps its engines running between profiles (issue 27 point 5): its
records carry a `demo` block (`demo_owner`), so the guard lets that demo swap only the router and refuses everyone
else while the demo runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.paths import compose_file, load_yaml, run_dir
from polarstack.processes import start_time
from polarstack.stack import compose, device, profiles

STATE_FILE = "docker-state.json"
DEFAULT_PROFILE = "engine-direct"
ONE_SHOT = frozenset({"model-download", "sandbox-build"})  # compose.yaml services that exit when done


@dataclass(frozen=True)
class DockerRecord:
    """The typed view of .run/docker-state.json (read/usable return its dict, which tests and tools read)."""

    profile: str
    base_url: str | None = None
    route: str | None = None
    started_at: float | None = None

    @classmethod
    def of(cls, data: dict[str, Any]) -> "DockerRecord":
        return cls(data["profile"], data.get("base_url"), data.get("route"), data.get("started_at"))


def state_path(directory: Path | None = None, *, cpu: bool) -> Path:
    """The record of the docker runtime on the caller's device (`cpu`: DEVICE=cpu, as the site resolved it); every
    function below takes the device from its caller the same way."""
    # DEVICE=cpu keeps its own record (docker-state.cpu.json): the CPU stack is another Compose project.
    return (directory or run_dir()) / device.state_file_for("cpu" if cpu else "gpu")


def read(directory: Path | None = None, *, cpu: bool) -> dict[str, Any] | None:
    path = state_path(directory, cpu=cpu)
    if not path.exists():
        return None
    dev = device.make_words(cpu)  # advice names the CPU stack's DEVICE=cpu
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        raise StackError(
            f"{path} is unreadable; check `make ps{dev}` and remove it, or run `make down PROFILE=...{dev}`.",
            ExitCode.STATE,
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("profile"), str):
        raise StackError(f"{path} names no profile; remove it after checking `make ps{dev}`.", ExitCode.STATE)
    return data


def write(
    profile,
    directory: Path | None = None,
    extra: dict[str, Any] | None = None,
    *,
    cpu: bool,
    demo: dict[str, Any] | None = None,
) -> Path:
    """Record that `profile` (a polarstack.stack.profiles.Profile) is up under Compose (`extra`: DEVICE=cpu's
    scripted tool answer, polarstack.stack.device.tool_record); `demo` (`demo_owner`): a `make demo` brought it up on engines
    it shares between profiles."""
    path = state_path(directory, cpu=cpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "profile": profile.name,
        "runtime": "docker",
        "started_at": time.time(),
        "base_url": profile.base_url(),
        "route": profile.route,
        **({"demo": demo} if demo else {}),
        **(extra or {}),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def write_unfinished(profile, directory: Path | None = None, *, cpu: bool) -> Path:
    """Record, just before `compose up --wait` starts, that `make up` of `profile` is under way: a record without
    base_url, which `usable` refuses as half-written and the next `make up` as unfinished
    (polarstack.stack.stack_faults.refuse_unfinished_up) until `write` replaces it or `make down` removes it. So an
    up that never finished (an engine unhealthy, a timeout, the terminal closed) is never taken for a stack that is up,
    and never silently started over."""
    path = state_path(directory, cpu=cpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"profile": profile.name, "runtime": "docker", "started_at": time.time(), "unfinished": "make up"}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def unfinished(state: dict[str, Any]) -> bool:
    """A record `make up` began and never completed (`write_unfinished`; any record without base_url reads so)."""
    return not isinstance(state.get("base_url"), str)


def clear(directory: Path | None = None, *, cpu: bool) -> bool:
    path = state_path(directory, cpu=cpu)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def forget(profile_name: str, directory: Path | None = None, *, cpu: bool) -> bool:
    """After `make down` (or Ctrl-C during `make up`) of `profile_name`: its record, or one that names no profile any
    more, is removed; another profile's is kept. The record is read again here: as it is after `compose down`, not as
    the site read it when the command began."""
    if (read(directory, cpu=cpu) or {}).get("profile") in (None, profile_name):
        return clear(directory, cpu=cpu)
    return False


# --- is the record still true? ---------------------------------------------------------------------------


def expected_services(profile_name: str) -> list[str]:
    """The long-running services compose.yaml starts in `profile_name` (engines, router, trainer)."""

    spec = load_yaml(compose_file().read_text())
    return [
        name
        for name, svc in spec["services"].items()
        if profile_name in (svc.get("profiles") or []) and name not in ONE_SHOT
    ]


def parse_ps(text: str) -> dict[str, dict[str, Any]]:
    """Service -> its entry, from `compose ps --format json`: one JSON array (Compose < 2.21) or one object a line."""
    text = text.strip()
    if not text:
        return {}
    try:
        entries = (
            json.loads(text)
            if text.startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except ValueError:
        raise StackError(
            f"`docker compose ps --format json` printed something that is not JSON ({text[:80]!r}); "
            "check the Compose install with `docker compose version`.",
            ExitCode.ENVIRONMENT,
        ) from None
    out: dict[str, dict[str, Any]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("Service"), str):
            out[entry["Service"]] = entry
    return out


def service_states(profile, where: compose.Where) -> dict[str, str]:
    """Each service of `profile`'s Compose project (on `where`'s device) that has a container -> "running", "exited",
    "unhealthy", ..."""

    proc = compose.run_compose(profile, ["ps", "--all", "--format", "json"], where=where, capture=True)
    if proc.returncode != 0:
        raise StackError(
            f"`docker compose ps` failed for profile {profile.name} ({compose.first_line(proc)}); "
            "start the Docker engine, then retry.",
            ExitCode.ENVIRONMENT,
        )
    states = {}
    for service, entry in parse_ps(proc.stdout).items():
        state = str(entry.get("State") or "unknown").lower()
        states[service] = "unhealthy" if state == "running" and entry.get("Health") == "unhealthy" else state
    return states


def not_running(profile, where: compose.Where) -> list[str]:
    """The long-running services of `profile` that do not run (absent, exited or unhealthy), as `name (state)`."""
    states = service_states(profile, where)
    return [
        f"{name} ({states.get(name, 'no container')})"
        for name in expected_services(profile.name)
        if states.get(name) != "running"
    ]


def usable(
    profile_requested: str | None,
    where: compose.Where,
    directory: Path | None = None,
    *,
    recorded: dict[str, Any] | None,
) -> dict[str, Any]:
    """The record of the profile up under Docker, when it is the one asked for and its stack still runs; else STATE.
    `recorded`: the record as the caller's site read it; `where`: the site's device and cluster."""

    state = recorded
    wanted = profile_requested or DEFAULT_PROFILE
    cpu = where.cpu
    dev = device.make_words(cpu)  # every command below names the CPU stack's DEVICE=cpu
    if state is None:
        raise StackError(
            f"nothing is up under Docker ({state_path(directory, cpu=cpu)} records no profile); run "
            f"`make up PROFILE={wanted}{dev}` first, or pass RUNTIME=local / BASE_URL=... to test something "
            "else.",
            ExitCode.STATE,
        )
    up = state["profile"]
    if profile_requested and profile_requested != up:
        raise StackError(
            f"profile {up} is up under Docker, not {profile_requested}; run `make down PROFILE={up}{dev}` "
            f"first and then `make up PROFILE={profile_requested}{dev}`, or drop PROFILE to use {up}.",
            ExitCode.STATE,
        )
    if not isinstance(state.get("base_url"), str):
        raise StackError(
            f"{state_path(directory, cpu=cpu)} is half-written (no base_url): `make up` did not finish; run "
            f"`make down PROFILE={up}{dev}` and `make up PROFILE={up}{dev}` again.",
            ExitCode.STATE,
        )
    profile = profiles.load(up)
    if profile.base_url() != state["base_url"]:
        raise StackError(
            f"configs/profiles/{up}.env changed since `make up` (the stack serves {state['base_url']}, "
            f"the file now says {profile.base_url()}); run `make down PROFILE={up}{dev}` and "
            f"`make up PROFILE={up}{dev}` to apply it.",
            ExitCode.STATE,
        )
    stopped = not_running(profile, where)
    if stopped:
        raise StackError(
            f"the docker stack of profile {up} recorded in {state_path(directory, cpu=cpu)} is not running "
            f"({', '.join(stopped)}); see `make logs PROFILE={up}{dev}`, then run `make down PROFILE={up}{dev}` "
            f"and `make up PROFILE={up}{dev}` again.",
            ExitCode.STATE,
        )
    return state


# --- a demo's shared engines (issue 27 point 5) --------------------------------------------------------------


def demo_owner(shared_engines: list[str]) -> dict[str, Any]:
    """The `demo` block of a record `make demo` writes: this process (pid and its kernel start time, so a recycled
    pid is no owner) and the engine services it keeps running from one profile to the next."""
    pid = os.getpid()
    return {"pid": pid, "start_time": start_time(pid), "shared_engines": sorted(shared_engines)}


def _demo_running(owner: dict[str, Any]) -> bool:
    return isinstance(owner.get("pid"), int) and owner.get("start_time") == start_time(owner["pid"]) is not None


def _same_demo(owner: dict[str, Any], demo: dict[str, Any] | None) -> bool:
    return demo is not None and (owner.get("pid"), owner.get("start_time")) == (demo.get("pid"), demo.get("start_time"))


def _guard_demo(
    verb: str, profile, state: dict[str, Any], running: list[str], demo: dict[str, Any] | None, cpu: bool
) -> bool:
    """The part of `guard_other_profile` for a record a demo wrote. True: the demo itself swaps profiles and may go on
    (only its shared engines still run). Refuses a user's command (or another demo's) while that demo runs; a record
    an ended demo left is judged like a user's (False)."""
    owner, up = state["demo"], state["profile"]
    shared = set(owner.get("shared_engines") or [])
    if _same_demo(owner, demo):
        others = [name for name in running if name not in shared]
        if others:
            raise StackError(
                f"the demo's previous profile {up} still runs {', '.join(others)} beside the shared engines; "
                f"stop them (`make down PROFILE={up}{device.make_words(cpu)}`) before profile {profile.name} starts.",
                ExitCode.STATE,
            )
        return True
    if _demo_running(owner):
        raise StackError(
            f"`make demo` (pid {owner['pid']}) runs profile {up} under Docker on engines it shares between profiles "
            f"({', '.join(sorted(shared)) or 'none'}); wait for it to finish or stop it with Ctrl-C, then "
            f"`make {verb} PROFILE={profile.name}`.",
            ExitCode.STATE,
        )
    return False


def guard_other_profile(
    verb: str, profile, where: compose.Where, directory: Path | None = None, *, demo: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Before `make up|down|clean PROFILE=X`: refuse while another profile's containers run; forget it when none does.

    Returns the record of `profile` itself, if it is the one up. Profiles share the project and service names,
    so acting on X while Y runs would recreate or stop Y's engines and trainer. `demo` (`demo_owner`): the caller
    is that `make demo`, which keeps its shared engines running from one profile to the next; a record of a
    running demo refuses everyone else, even for the same profile. `where`: the caller's device and cluster. The
    record is read here, as it is now: `make up`'s refuse_unfinished_up may have cleared the one the site read, and a
    demo rewrites it at every profile.
    """
    cpu = where.cpu
    state = read(directory, cpu=cpu)
    owner = state.get("demo") if state else None
    if isinstance(owner, dict) and not _same_demo(owner, demo) and _demo_running(owner):
        _guard_demo(verb, profile, state, [], demo, cpu)  # refuses: the stack is that demo's
    if state is None or state["profile"] == profile.name:
        return state

    up = state["profile"]
    states = service_states(profiles.load(up), where)
    running = sorted(name for name, value in states.items() if value in ("running", "unhealthy", "restarting"))
    if isinstance(owner, dict) and _guard_demo(verb, profile, state, running, demo, cpu):
        clear(directory, cpu=cpu)  # the demo's own swap: its engines stay, the next profile writes its record
        return None
    if running:
        raise StackError(
            f"profile {up} is up under Docker ({', '.join(running)} running) and stays recorded; run "
            f"`make down PROFILE={up}{device.make_words(cpu)}` first, then `make {verb} PROFILE={profile.name}"
            f"{device.make_words(cpu)}`.",
            ExitCode.STATE,
        )
    clear(directory, cpu=cpu)  # a stale record: none of its containers runs
    import sys

    print(f"forgot the record of profile {up}: none of its containers runs.", file=sys.stderr)
    return None
