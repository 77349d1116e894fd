"""What a check or a run talks to: the URL Polar's requests go to, the route, the engines, the model, the profile.

One rule for `smoke` and `train` (docs/architecture.md, step 5 of `make train`):
- an explicit --base-url wins (smoke only): nothing is read from any run state;
- else, with --runtime auto|local, the stack `polarstack up` recorded (local.LocalState), refused (STATE) when it
  died, is half-written, or is another profile than --profile names;
- else the docker runtime: the profile `make up` recorded (docker_state.usable, STATE when it is not the one asked
  for or no longer runs), its ports from the profile file (Profile.base_url / docker_engine_urls).
Refusal sentences differ per verb where the tests pin them (smoke without anything up is a USAGE error that
suggests --base-url; train says what to start).
"""

from __future__ import annotations

from dataclasses import dataclass

from polarstack.errors import ExitCode, StackError
from polarstack.stack import cluster as cluster_mod
from polarstack.stack import docker_state, profiles
from polarstack.stack.profiles import (
    Profile,
    docker_engine_urls,
    registered_engines,
    stack_knobs,
)
from polarstack.stack.resolved import Resolved, read_now

RUNTIMES = ("auto", "local", "docker")


@dataclass(frozen=True)
class Target:
    runtime: str  # "url" (an explicit --base-url), "local" (`polarstack up`) or "docker" (`make up`)
    profile: str | None  # the profile's name; None for an explicit --base-url
    base_url: str  # where Polar's requests go: the router or engine-0
    route: str | None  # base | polar: the caller's --route, else the recorded or profile's POLAR_ROUTE (None: unknown)
    engine_urls: list[str] | None = None  # the engines behind base_url (None: not known, e.g. an explicit URL)
    register: list[str] | None = None  # engines to register temporarily before the check (registered_engines)
    loaded: Profile | None = None  # the profile, when resolving it needed the file (docker)
    nodes: list[dict] | None = None  # NODES>1: every node's engines (cluster.NodeLayout.as_dict), for the smoke

    @property
    def local(self) -> bool:
        return self.runtime == "local"

    def served_model(self) -> str | None:
        """The model name requests carry when none is given: the docker stack serves SERVED_MODEL_NAME
        (configs/stack.env); elsewhere None (the first id of GET /v1/models)."""
        if self.runtime != "docker":
            return None
        return stack_knobs().get("SERVED_MODEL_NAME")


def _refuse_nothing_local(verb: str) -> StackError:
    if verb == "smoke":
        return StackError(
            "no profile is up locally and no --base-url was given; run `make up PROFILE=engine-direct "
            "RUNTIME=local` or pass --base-url.",
            ExitCode.USAGE,
        )
    return StackError("nothing is up locally; run `make up PROFILE=engine-direct RUNTIME=local` first.", ExitCode.STATE)


def resolve_target(
    runtime: str,
    profile: str | None,
    base_url: str | None,
    *,
    route: str | None = None,
    verb: str = "smoke",
    in_trainer: bool = False,
    plan_only: bool = False,
    site: Resolved | None = None,
) -> Target:
    """The target of `verb` (smoke|train) for --runtime, --profile and --base-url (module docstring: the rule).

    `in_trainer`: the smoke inside the trainer container checks `profile`'s ports, reading no run state (the
    host checked the record before it ran there). `plan_only`: a dry run plans the default profile when
    nothing is up under Docker instead of refusing. `site`: what the CLI resolved (the run states, the cluster), read
    when needed; None: read here (stack.resolved.read_now)."""
    if base_url is not None:
        return Target("url", None, base_url, route)
    site = site if site is not None else read_now()
    if runtime in ("auto", "local") and not in_trainer:
        state = site.local_state
        if state is not None:  # a recorded local stack: use it, or refuse (STATE) when it died or is half-written
            state.usable()
            if profile and profile != state.profile:  # smoke and train alike (smoke used to check the local one)
                raise StackError(
                    f"profile {state.profile} is up locally, not {profile}; run `make down RUNTIME=local` "
                    f"and `make up PROFILE={profile} RUNTIME=local`, or drop PROFILE.",
                    ExitCode.STATE,
                )
            return Target(
                "local", state.profile, state.base_url, route or state.route, state.engine_urls, nodes=state.nodes
            )
        if runtime == "local":
            raise _refuse_nothing_local(verb)
    if in_trainer:
        name = profile
    else:
        if verb == "smoke" and profile is None and runtime == "auto" and site.docker_record is None:
            raise StackError(
                "no profile is up (locally or under Docker) and no --base-url or --profile was given; run "
                "`make up PROFILE=engine-direct` (add RUNTIME=local without a GPU) or pass --base-url.",
                ExitCode.USAGE,
            )
        # The record of `make up` must name this profile and its stack must still run (STATE otherwise); a dry run
        # with nothing up plans the default profile.
        record = None
        if not plan_only or site.docker_record is not None:
            record = docker_state.DockerRecord.of(docker_state.usable(profile, site, recorded=site.docker_record))
        name = profile or (record.profile if record else docker_state.DEFAULT_PROFILE)
    loaded = profiles.load(name)
    # NODES>1: the router on the head's address and every node's engines by theirs (polarstack.stack.cluster).
    found = site.cluster
    engines = docker_engine_urls(loaded) if not found.multi else cluster_mod.engine_urls(loaded, found)
    return Target(
        "docker",
        loaded.name,
        loaded.base_url(found.head_addr),
        route or loaded.route,
        engines,
        registered_engines(loaded, engines),
        loaded,
        # the smoke's per-engine, per-node check (checks.per_engine), as the local runtime's state gives it
        nodes=[node.as_dict() for node in cluster_mod.layout(loaded, found)] if found.multi else None,
    )
