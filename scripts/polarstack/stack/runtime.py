"""One runtime interface, two implementations: the local runtime (processes on 127.0.0.1, polarstack.stack.local) and
the docker runtime (Compose v2, polarstack.stack.compose), each with `up`, `down`, `status`, `smoke_target` and
`run_in_trainer` (issue 35 point 2). The CLI builds one from the site (polarstack.cli.site) and calls it; what `up`
checks, in which order, and what `down` refuses is decided here, not in the CLI.

The checks of `up` that live above this layer (the verifier in Polar's namespace shape, checks/; the memory estimate
and the NODES>1 node reports, train/) are handed in as `UpChecks` by the caller; this module decides when they run.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from polarstack.errors import ExitCode, StackError
from polarstack.processes import sigterm_as_interrupt
from polarstack.stack import assets, compose, device, docker_state, local, ray_auth, stack_faults
from polarstack.stack import cluster as cluster_layout
from polarstack.stack.cluster import Cluster
from polarstack.stack.local import LocalState
from polarstack.stack.profiles import Profile
from polarstack.stack.resolved import Resolved
from polarstack.stack.target import Target, resolve_target


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class NodeSteps(Protocol):
    """`make up`'s steps at NODES>1 that live above stack/ (polarstack.train.cluster_up.NodeSteps)."""

    def before_up(self, found: Cluster) -> None: ...

    def open_session(self, profile: Profile, found: Cluster) -> None: ...

    def after_up(self, profile: Profile, where: compose.Where) -> None: ...


@dataclass(frozen=True)
class UpChecks:
    """The checks of `up` from the layers above (handed in by the CLI); `up` decides when each runs."""

    verifier: Callable[[Profile], None]  # the reward in Polar's namespace shape (checks.shape_probe)
    memory: Callable[[Profile, int], Sequence[str]] | None = None  # docker: the estimate per node (train.memory)
    nodes: NodeSteps | None = None  # docker at NODES>1: the node reports and the cluster check
    say: Callable[[str], None] = _say


@dataclass(frozen=True)
class UpRequest:
    """How `up` was asked: the docker runtime's services, the local runtime's engines and waits."""

    services: tuple[str, ...] = ()  # docker: only these services (`--service`)
    timeout: float = 60.0  # local: seconds to wait for each process
    engine: str = "emulator"  # local: emulator or sglang
    engine_args: tuple[str, ...] = ()  # local: the emulated engines' service-time flags
    wait_nodes: float = local.WAIT_NODES_SECONDS  # local at NODES>1


@dataclass(frozen=True)
class Status:
    """What `status` found: Compose's exit code (docker: `compose ps` printed its table), or the local run state."""

    code: int = 0
    data: dict[str, Any] = field(default_factory=dict)  # local: the run state as `status --json` prints it
    state: LocalState | None = None


class Runtime(Protocol):
    name: ClassVar[str]

    def up(self, profile: Profile, request: UpRequest, checks: UpChecks) -> LocalState | Path | None: ...

    def down(self, profile: Profile | None = None, services: Sequence[str] = ()) -> list[tuple[str, list[int]]]: ...

    def status(self, profile: Profile | None = None, services: Sequence[str] = ()) -> Status: ...

    def smoke_target(self, profile: str | None, route: str | None, *, verb: str = "smoke") -> Target: ...

    def run_in_trainer(
        self, profile: Profile, command: Sequence[str], *, capture: bool = False
    ) -> subprocess.CompletedProcess: ...


# --- the local runtime ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalRuntime:
    """Processes on 127.0.0.1 (`polarstack up`): emulated or real CPU engines and the real router wheels."""

    site: Resolved  # the cluster and the run state, as the CLI resolved them
    name: ClassVar[str] = "local"

    def up(self, profile: Profile, request: UpRequest, checks: UpChecks) -> LocalState:
        found = self.site.cluster  # configs/cluster.env and the environment; one node unless NODES>1
        refused = cluster_layout.refusal(profile, found)
        if refused:  # before anything starts
            raise StackError(refused, ExitCode.USAGE)
        sigterm_as_interrupt()  # stop what was started, like Ctrl-C does
        return local.up(
            profile,
            timeout=request.timeout,
            progress=checks.say,
            engine_args=list(request.engine_args),
            engine=request.engine,
            cluster=found if found.multi else None,
            wait_nodes=request.wait_nodes,
            before_start=lambda: checks.verifier(profile),  # the reward in the sessions' namespace shape, here
        )

    def down(self, profile: Profile | None = None, services: Sequence[str] = ()) -> list[tuple[str, list[int]]]:
        """Stop `up`'s stack and whatever a killed `demo` left in .run/demo/: (profile, pids stopped) each, said."""
        stacks = local.down_all()
        if not stacks:
            _say("nothing is up locally; nothing to stop.")
        for name, pids in stacks:
            print(f"{name} is down (stopped pids {', '.join(map(str, pids)) or 'none: all had exited'}).")
        return stacks

    def status(self, profile: Profile | None = None, services: Sequence[str] = ()) -> Status:
        state = self.site.local_state
        if state is None:
            return Status(data={"up": False})
        live = state.live()
        return Status(data={"up": bool(live), **state.data, "live_pids": [p["pid"] for p in live]}, state=state)

    def smoke_target(self, profile: str | None, route: str | None, *, verb: str = "smoke") -> Target:
        return resolve_target("local", profile, None, route=route, verb=verb, site=self.site)

    def run_in_trainer(
        self, profile: Profile, command: Sequence[str], *, capture: bool = False
    ) -> subprocess.CompletedProcess:
        raise StackError(
            "the local runtime has no trainer (slime, Ray and the GPUs run only in the node's containers); run this "
            "on the docker runtime.",
            ExitCode.ENVIRONMENT,
        )


# --- the docker runtime -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DockerRuntime:
    """Compose v2 on this host: the node's stack, or DEVICE=cpu's own project, ports and run state."""

    site: Resolved  # the device, the cluster and the record, as the CLI resolved them
    name: ClassVar[str] = "docker"

    @property
    def cpu(self) -> bool:
        return self.site.cpu

    @property
    def cluster(self) -> Cluster:
        return self.site.cluster

    def check_node(self, verb: str, profile: Profile | None, *, gpus: bool = False) -> None:
        """Docker, its engine and Compose (and the NVIDIA runtime and GPUs when `gpus`, never on DEVICE=cpu); the
        site's cluster is asked for first."""
        where = compose.Place(self.cpu, self.cluster)
        compose.check_node(verb, profile, need_gpus=gpus and not self.cpu, where=where)

    def compose(self, profile: Profile, args: Sequence[str], *, capture: bool = False) -> subprocess.CompletedProcess:
        return compose.run_compose(profile, list(args), where=self.site, capture=capture)

    def up(self, profile: Profile, request: UpRequest, checks: UpChecks) -> Path | None:
        """`make up`: every check in its order (each refusal one sentence), then `compose up --wait`, then the record.
        None when the profile was up already (nothing started or recreated)."""
        self.check_node("up", profile, gpus=True)
        # STATE: an earlier `make up` never finished and left containers (its record as the site read it)
        stack_faults.refuse_unfinished_up(profile, self.site.docker_record, self.site)
        # profiles share service names: never X while Y runs
        record = docker_state.guard_other_profile("up", profile, self.site)
        if stack_faults.already_up(profile, record, self.site):  # `make up` twice: nothing started or recreated
            if self.cluster.multi and checks.nodes:  # but this node's report is written again, into the head's session
                checks.nodes.after_up(profile, self.site)
            return None
        stack_faults.refuse_taken_ports(profile)  # STATE: a port of the stack is taken (host networking)
        if self.cpu:  # the CPU bases and the tiny model (cached)
            device.prepare(checks.say)
        if self.cluster.multi and checks.nodes:  # the interface, Ray's token, SHARED_DIR
            checks.nodes.before_up(self.cluster)
        self._before_start(profile, checks)
        if self.cluster.multi and checks.nodes:  # every check passed: the head opens the session before anything starts
            checks.nodes.open_session(profile, self.cluster)
        self._compose_up(profile, request.services)
        extra = device.tool_record(profile.router) if self.cpu else None  # real engines: a scripted tool answer
        path = docker_state.write(profile, extra=extra, cpu=self.cpu)
        checks.say(f"{profile.name} is up (state in {path}); `make smoke` and `make train` use it.")
        port = profile.setting("RAY_DASHBOARD_PORT", "8265")
        checks.say("\n".join(ray_auth.login_lines(compose.token_file(), port)))  # the file, never the token
        if self.cluster.multi and checks.nodes:  # this node's report; the cluster check once every node is up
            checks.nodes.after_up(profile, self.site)
        return path

    def _before_start(self, profile: Profile, checks: UpChecks) -> None:
        """Weights, sandbox image, agent CLI and images, the memory, the verifier: before any engine starts."""
        assets.check_before_up(profile, cpu=self.cpu)
        # ASSETS_MISSING naming `make build` (DEVICE=cpu: builds them)
        stack_faults.images_before_up(profile, self.site)
        if self.cpu:  # the tiny model on the CPU: the estimate is the GPU node's, not this stack's
            checks.say(
                "memory: not estimated for DEVICE=cpu (the tiny model on the CPU; the node's estimate: make train "
                "DRY_RUN=1)"
            )
        elif checks.memory is not None:  # refuses a node too small for make train (per node at NODES>1)
            checks.say("\n".join(checks.memory(profile, self.cluster.nodes)))
        checks.verifier(profile)  # the reward in the namespace shape of Polar's sessions, in the trainer image

    def _compose_up(self, profile: Profile, services: Sequence[str]) -> None:
        sigterm_as_interrupt()  # a SIGTERM takes down what this `up` started, like Ctrl-C
        # until `write`: the next `make up` refuses, `make down` finds it
        docker_state.write_unfinished(profile, cpu=self.cpu)
        try:
            proc = self.compose(profile, ["up", "--detach", "--wait", *services])
        except KeyboardInterrupt:  # Ctrl-C half-way: nothing of this profile is left running or recorded
            stack_faults.take_down_after_interrupt(profile, self.site)
            raise
        if proc.returncode in (130, -2):  # Compose got the Ctrl-C (this process may have SIGINT ignored): the same
            stack_faults.take_down_after_interrupt(profile, self.site)
            raise KeyboardInterrupt
        if proc.returncode != 0:
            raise stack_faults.why_up_failed(profile, proc.returncode, self.site)

    def down(self, profile: Profile | None = None, services: Sequence[str] = ()) -> list[tuple[str, list[int]]]:
        """`make down`: the profile's containers, refused while another profile runs; its record forgotten. []
        when nothing of it was up (said on stderr)."""
        assert profile is not None, "the docker runtime stops one profile"
        self.check_node("down", profile)
        # profiles share service names: never Y for X
        record = docker_state.guard_other_profile("down", profile, self.site)
        if record is None and not docker_state.service_states(profile, self.site):
            _say(f"nothing of profile {profile.name} is up under Docker ({device.project(self.cpu)}); nothing to stop.")
            return []
        self._compose_or_fail("down", profile, ["down", *services])
        docker_state.forget(profile.name, cpu=self.cpu)
        return [(profile.name, [])]

    def clean(self, profile: Profile, confirm: Callable[[], bool]) -> int:
        """`make clean`: the stack and its volumes once `confirm` says yes; refused while another profile runs."""
        self.check_node("clean", profile)
        if not confirm():
            print("nothing deleted.")
            return 0
        docker_state.guard_other_profile("clean", profile, self.site)  # another profile running: refused, record kept
        code = self.compose(profile, ["down", "--volumes"]).returncode
        if code == 0:
            docker_state.clear(cpu=self.cpu)
        return code

    def render(self, profile: Profile) -> tuple[Path, Path]:
        """`polarstack compose env`: .run/compose/<profile>.env and .gpus.yaml (DEVICE=cpu: .run/compose-cpu/)."""
        return compose.render(profile, cluster=self.cluster, cpu=self.cpu)

    def config(self, profile: Profile) -> str:
        """`polarstack compose config`: the Compose model of the profile, as Compose resolves it."""
        proc = self.compose(profile, ["config"], capture=True)
        if proc.returncode != 0:
            raise StackError(f"Compose rejected profile {profile.name}: {compose.first_line(proc)}", ExitCode.USAGE)
        return proc.stdout

    def status(self, profile: Profile | None = None, services: Sequence[str] = ()) -> Status:
        """`make ps`: Compose prints the containers of the profile."""
        assert profile is not None, "the docker runtime lists one profile's containers"
        self.check_node("ps", profile)
        return Status(code=self._compose_or_fail("ps", profile, ["ps", *services]))

    def run_verb(self, verb: str, profile: Profile, services: Sequence[str] = ()) -> int:
        """`make logs` and `make build`: Compose's own verb, its output as it comes."""
        self.check_node(verb, profile)
        if verb == "build" and self.cpu:  # the CPU bases and the tiny model (cached)
            device.prepare(_say)
        args = ["logs", "--tail", "200"] if verb == "logs" else [verb]
        return self._compose_or_fail(verb, profile, [*args, *services])

    def oneshot(self, verb: str, profile: Profile) -> int:
        """`make model` / `make sif`: a one-shot service into the models volume (`make sif` is the node's only)."""
        if verb == "sif" and self.cpu:
            raise StackError(
                "make sif runs only on the node (the sandbox needs node 22 and apptainer from GitHub); DEVICE=cpu's "
                "`make up` skips the sandbox check by name.",
                ExitCode.USAGE,
            )
        return compose.run_oneshot(verb, profile, self.site)

    def _compose_or_fail(self, verb: str, profile: Profile, args: list[str]) -> int:
        proc = self.compose(profile, args)
        if proc.returncode != 0:
            raise StackError(
                f"docker compose {verb} failed for profile {profile.name} (exit {proc.returncode}); "
                "see the output above.",
                ExitCode.ENVIRONMENT,
            )
        return 0

    def smoke_target(self, profile: str | None, route: str | None, *, verb: str = "smoke") -> Target:
        return resolve_target("docker", profile, None, route=route, verb=verb, site=self.site)

    def run_in_trainer(
        self, profile: Profile, command: Sequence[str], *, capture: bool = False
    ) -> subprocess.CompletedProcess:
        """`docker compose exec -T trainer COMMAND` in `profile`'s project."""
        return self.compose(profile, ["exec", "-T", "trainer", *command], capture=capture)
