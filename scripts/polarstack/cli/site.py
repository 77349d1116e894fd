"""Where this command runs, resolved once per command (issue 35 point 1): the device, what is up, the cluster layout,
the profile with its stack settings, and the runtime that acts on them (polarstack.stack.runtime).

`cli/main.py` builds the site right after parsing, before any handler runs. The device is DEVICE= when it is given
(POLARSTACK_DEVICE, which the Makefile passes only then), else the device of the docker stack that is up: a record of
the CPU stack (`.run/docker-state.cpu.json`, polarstack.stack.device) and none of the node's makes it cpu, so
`make smoke`, `make down`, `make ps` and `make train` act on the CPU stack without DEVICE=cpu. The device found is
applied for the command (POLARSTACK_DEVICE and the CPU stack's ports, device.apply_cpu_defaults) and undone after it.

What is up is every recorded stack: the local runtime's (`.run/state.json`, polarstack.stack.local) and the docker
runtime's of either device. With two of them, a command that acts on "the stack that is up" without being told which
(`smoke` and `down` without RUNTIME=, DEVICE= or BASE_URL=) refuses (STATE) and names both with the command for each.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polarstack.errors import ExitCode, StackError
from polarstack.paths import run_dir
from polarstack.stack import device, docker_state, local, profiles
from polarstack.stack.profiles import Profile
from polarstack.stack.resolved import ReadOnce
from polarstack.stack.runtime import DockerRuntime, LocalRuntime


@dataclass(frozen=True)
class Stack:
    """One stack with a run-state record: the local runtime's, or the docker runtime's on one device."""

    runtime: str  # local | docker
    device: str | None  # docker: gpu | cpu; None for the local runtime
    profile: str  # the profile the record names ("?" when it names none)
    record: Path

    def words(self) -> str:
        """What tells make this stack: RUNTIME=local, RUNTIME=docker, or RUNTIME=docker DEVICE=cpu."""
        if self.runtime == "local":
            return "RUNTIME=local"
        return "RUNTIME=docker DEVICE=cpu" if self.device == "cpu" else "RUNTIME=docker"

    def describe(self) -> str:
        where = (
            "locally"
            if self.runtime == "local"
            else "under Docker" + (" on DEVICE=cpu" if self.device == "cpu" else "")
        )
        return f"profile {self.profile} {where} ({self.record})"


@dataclass(frozen=True)
class Site(ReadOnce):
    """Where this command runs (module docstring). Built once per command by cli/main.py; each field that costs a read
    (the cluster, the run states: stack.resolved.ReadOnce; the profile) is read when first asked, at most once. It is
    the polarstack.stack.resolved.Resolved the layers below take instead of reading for themselves."""

    device: str  # gpu | cpu: DEVICE= when given, else the device of the docker stack that is up
    device_given: bool  # DEVICE= (POLARSTACK_DEVICE) was set for this command
    up: tuple[Stack, ...]  # every stack with a run-state record
    profile_asked: str | None = None  # the command's --profile, if it has one

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def local_up(self) -> bool:
        """The local runtime has a recorded stack (`polarstack up`)."""
        return any(stack.runtime == "local" for stack in self.up)

    @functools.cached_property
    def profile(self) -> Profile:
        """The profile the command acts on, its stack settings resolved (Profile.setting): --profile, else the one
        `make up` recorded on this device, else engine-direct."""
        record = self.docker_record if not self.profile_asked else None
        return profiles.load(self.profile_asked or (record["profile"] if record else docker_state.DEFAULT_PROFILE))

    @functools.cached_property
    def settings(self) -> dict[str, str]:
        """The stack's settings without a profile (configs/stack.env and the environment, profiles.stack_settings),
        for the commands that run no profile's stack (the routing bench's and the router matrix's engines)."""
        return profiles.stack_settings()

    def local(self) -> LocalRuntime:
        return LocalRuntime(self)

    def docker(self) -> DockerRuntime:
        return DockerRuntime(self)

    def runtime_to_stop(self, asked: str) -> LocalRuntime | DockerRuntime:
        """`down --runtime asked`: local or docker as asked; auto (`make down`): the stack that is up, refused (STATE)
        when two are, the docker runtime when none is recorded (its containers may be there without a record)."""
        if asked == "auto":
            self.refuse_two("down")
            asked = "local" if self.local_up else "docker"
        return self.local() if asked == "local" else self.docker()

    def refuse_two(self, verb: str) -> None:
        """STATE naming every stack that is up and the command for each, when more than one is (`verb`: smoke, down)."""
        if len(self.up) < 2:
            return
        names = " and ".join(stack.describe() for stack in self.up)
        commands = " or ".join(f"`make {verb} {stack.words()}`" for stack in self.up)
        raise StackError(f"{len(self.up)} stacks are up: {names}; name the one to {verb}: {commands}.", ExitCode.STATE)


def _profile_of(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    name = data.get("profile") if isinstance(data, dict) else None
    return name if isinstance(name, str) else "?"


def _recorded() -> tuple[Stack, ...]:
    """Every stack with a run-state record under .run/: the local runtime's, the node's docker stack, the CPU one."""
    directory = run_dir()
    found = []
    path = directory / local.STATE_FILE
    if path.exists():
        found.append(Stack("local", None, _profile_of(path), path))
    for name in device.DEVICES:
        path = directory / device.state_file_for(name)
        if path.exists():
            found.append(Stack("docker", name, _profile_of(path), path))
    return tuple(found)


def build(profile_asked: str | None = None) -> Site:
    """The site of this command (module docstring): DEVICE= when given, else the device of the docker stack up.
    `profile_asked`: the command's --profile."""
    up = _recorded()
    given = bool((os.environ.get(device.DEVICE_ENV) or "").strip())
    if given:
        name = device.current()  # USAGE for anything but gpu or cpu
    else:
        docker = {stack.device for stack in up if stack.runtime == "docker"}
        name = "cpu" if docker == {"cpu"} else "gpu"
    return Site(name, given, up, profile_asked)


@contextlib.contextmanager
def applied(site: Site) -> Iterator[None]:
    """The site's device for the length of the command: POLARSTACK_DEVICE and, on cpu, the CPU stack's defaults
    (device.apply_cpu_defaults; the environment still wins); what it set is undone afterwards."""
    saved = dict(os.environ)
    if site.device == "cpu":
        os.environ[device.DEVICE_ENV] = "cpu"
        device.apply_cpu_defaults()
    changed = {key: saved.get(key) for key in os.environ if os.environ[key] != saved.get(key)}
    try:
        yield
    finally:
        for key, value in changed.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
