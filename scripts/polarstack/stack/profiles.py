"""Profiles: one KEY=value file per profile in configs/profiles/, read by both runtimes.

The local runtime (polarstack up --runtime local) and Docker Compose (--env-file) read the same files.
Validation names the file and the fix: unknown keys, bad values, GPU sets that overlap or exceed the node,
a router the pins file does not define.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from polarstack import paths
from polarstack.errors import ExitCode, StackError
from polarstack.pins import parse_env_file, pins
from polarstack.routers.catalog import RouterRelease

PROFILE_ORDER = ("router-passthrough", "engine-direct", "patched-router", "stock-router")
ROUTERS = {"passthrough": "ROUTER_PASSTHROUGH", "patched": "ROUTER_PATCHED", "stock": "ROUTER_STOCK"}
REQUIRED = (
    "PROFILE_NAME",
    "PROFILE_ROLE",
    "ROUTER",
    "ROUTER_REGISTRATION",
    "ENGINE_COUNT",
    "ENGINE_GPUS",
    "TRAINER_GPUS",
    "ENGINE_PORT_BASE",
    "ROUTER_PORT",
    "POLAR_BASE",
    "POLAR_ROUTE",
    "POLAR_WORKER_DISCOVERY",
    "EXPECT_SMOKE",
)
OPTIONAL = (
    "ENGINE_EXTRA_ARGS",  # extra sglang.launch_server flags (docker runtime), may be empty
    # configs/stack.env knobs a profile may override (issue 10 points 4 and 7); see `knob`.
    "ENGINE_TOOL_CALL_PARSER",
    "WEIGHT_SYNC_TRANSPORT",
    "ROUTER_ARGS",
)  # routing policy flags for the router, both runtimes (docs/routing.md), may be empty
WEIGHT_SYNC_TRANSPORTS = ("disk", "nccl")  # slime --update-weight-transport choices at SLIME_COMMIT
# Router flags the stack itself sets from other keys; ROUTER_ARGS must not repeat them.
STACK_ROUTER_FLAGS = (
    "--host",
    "--port",
    "--worker-urls",
    "--prometheus-port",
    "--prometheus-host",
    "--worker-startup-check-interval",
)
NODE_GPUS_DEFAULT = 4


def parse_node_gpus(text: str | None, origin: str = "NODE_GPUS") -> int:
    """NODE_GPUS (environment or configs/stack.env) as a positive count; USAGE naming the fix otherwise."""
    if text is None:
        return NODE_GPUS_DEFAULT
    if not text.strip().isdigit() or int(text) < 1:
        raise StackError(f"{origin}={text!r} must be the node's GPU count, a whole number like 4.", ExitCode.USAGE)
    return int(text)


profiles_dir = paths.profiles_dir  # kept for old imports; the rule lives in polarstack.paths


def available() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.env") if not p.name.endswith(".local.env"))


def _gpus(path: Path, key: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise StackError(
            f"{path}: {key}={text!r} must be comma-separated GPU indices like 0,1.", ExitCode.USAGE
        ) from None
    if len(set(values)) != len(values):
        raise StackError(f"{path}: {key}={text} lists a GPU twice.", ExitCode.USAGE)
    return values


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    values: dict[str, str]
    # Its stack settings, resolved once when it was loaded as `knob` resolves each: the profile's value, else the
    # environment's, else configs/stack.env's (`setting`).
    settings: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def setting(self, key: str, default: str = "") -> str:
        """A stack knob of this profile as loaded (`knob`'s rule, resolved once by `load`); `default` when unset."""
        return self.settings.get(key, default)

    @property
    def engine_extra_args(self) -> list[str]:
        return self.values.get("ENGINE_EXTRA_ARGS", "").split()

    @property
    def router_args(self) -> list[str]:
        """Routing flags (policy, thresholds) appended to the router's launch in both runtimes."""
        return shlex.split(self.values.get("ROUTER_ARGS", ""))

    @property
    def role(self) -> str:
        return self.values["PROFILE_ROLE"]

    @property
    def router(self) -> RouterRelease | None:
        key = self.values["ROUTER"]
        if key == "none":
            return None
        prefix = ROUTERS[key]
        table = pins()
        return RouterRelease(table[f"{prefix}_PACKAGE"], table[f"{prefix}_VERSION"])

    @property
    def registration(self) -> str:
        return self.values["ROUTER_REGISTRATION"]

    @property
    def engine_count(self) -> int:
        return int(self.values["ENGINE_COUNT"])

    @property
    def engine_gpus(self) -> list[int]:
        return _gpus(self.path, "ENGINE_GPUS", self.values["ENGINE_GPUS"])

    @property
    def trainer_gpus(self) -> list[int]:
        return _gpus(self.path, "TRAINER_GPUS", self.values["TRAINER_GPUS"])

    @property
    def polar_base(self) -> str:
        return self.values["POLAR_BASE"]

    @property
    def route(self) -> str:
        return self.values["POLAR_ROUTE"]

    @property
    def expect(self) -> str:
        return self.values["EXPECT_SMOKE"]

    def engine_port(self, index: int) -> int:
        return int(self.values["ENGINE_PORT_BASE"]) + 10 * index

    @property
    def router_port(self) -> int:
        return int(self.values["ROUTER_PORT"])

    def base_url(self, host: str = "127.0.0.1") -> str:
        """Polar's base URL under Docker (the profile's ports), by the rule of polarstack.stack.profiles.polar_base_url."""
        return polar_base_url(self, f"http://{host}:{self.router_port}", [f"http://{host}:{self.engine_port(0)}"])


def validate(name: str, path: Path, values: dict[str, str], node_gpus: int) -> None:
    def bad(message: str) -> StackError:
        return StackError(f"{path}: {message}", ExitCode.USAGE)

    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise bad(f"missing {', '.join(missing)}; copy the key from configs/profiles/engine-direct.env.")
    unknown = sorted(set(values) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise bad(f"unknown key {unknown[0]}; the profile keys are {', '.join(REQUIRED)}.")
    empty = [k for k in REQUIRED if values[k] == ""]
    if empty:
        raise bad(f"{empty[0]} is empty; give it a value.")
    choices = {
        "PROFILE_ROLE": ("working", "diagnostic"),
        "ROUTER": ("none", *ROUTERS),
        "ROUTER_REGISTRATION": ("none", "static", "register"),
        "POLAR_BASE": ("engine-0", "router"),
        "POLAR_ROUTE": ("base", "polar"),
        "POLAR_WORKER_DISCOVERY": ("on", "off"),
        "EXPECT_SMOKE": ("pass", "TOKENS_MISSING", "INVARIANT", "HTTP_ERROR"),
    }
    for key, allowed in choices.items():
        if values[key] not in allowed:
            raise bad(f"{key}={values[key]} must be one of {', '.join(allowed)}.")
    for key in ("ENGINE_COUNT", "ENGINE_PORT_BASE", "ROUTER_PORT"):
        if not values[key].isdigit() or int(values[key]) <= 0:
            raise bad(f"{key}={values[key]} must be a positive integer.")
    _check_ports(values, bad)
    if (values["ROUTER"] == "none") != (values["ROUTER_REGISTRATION"] == "none"):
        raise bad("ROUTER and ROUTER_REGISTRATION must both be none or both be set.")
    if values["ROUTER"] == "none" and values["POLAR_BASE"] == "router":
        raise bad("POLAR_BASE=router needs a ROUTER; set POLAR_BASE=engine-0.")
    transport = values.get("WEIGHT_SYNC_TRANSPORT")
    if transport and transport not in WEIGHT_SYNC_TRANSPORTS:
        raise bad(f"WEIGHT_SYNC_TRANSPORT={transport} must be one of {', '.join(WEIGHT_SYNC_TRANSPORTS)}.")
    engines = _gpus(path, "ENGINE_GPUS", values["ENGINE_GPUS"])
    trainer = _gpus(path, "TRAINER_GPUS", values["TRAINER_GPUS"])
    if len(engines) != int(values["ENGINE_COUNT"]):
        raise bad(
            f"ENGINE_GPUS={values['ENGINE_GPUS']} lists {len(engines)} GPU(s) for ENGINE_COUNT="
            f"{values['ENGINE_COUNT']}; give one GPU per engine."
        )
    if not trainer:
        raise bad("TRAINER_GPUS is empty; the trainer needs at least one GPU.")
    overlap = sorted(set(engines) & set(trainer))
    if overlap:
        raise bad(f"GPU {overlap[0]} is in both ENGINE_GPUS and TRAINER_GPUS; engines and trainer need disjoint GPUs.")
    beyond = [g for g in engines + trainer if not 0 <= g < node_gpus]
    if beyond:
        raise bad(
            f"GPU {beyond[0]} does not exist on a {node_gpus}-GPU node (NODE_GPUS={node_gpus}); use 0-{node_gpus - 1}."
        )
    if values["ROUTER"] != "none":
        prefix = ROUTERS[values["ROUTER"]]
        table = pins()
        for suffix in ("PACKAGE", "VERSION"):
            if f"{prefix}_{suffix}" not in table:
                raise bad(f"ROUTER={values['ROUTER']} needs {prefix}_{suffix} in configs/pins.env.")
        release = RouterRelease(table[f"{prefix}_PACKAGE"], table[f"{prefix}_VERSION"])
        if values["ROUTER_REGISTRATION"] == "register" and not release.has_worker_api:
            raise bad(f"{release.spec} has no POST /workers; use ROUTER_REGISTRATION=static.")
    _validate_router_args(values, bad)


def _validate_router_args(values: dict[str, str], bad) -> None:
    """ROUTER_ARGS: shell words, no flag the stack sets itself, a --policy the pinned release offers.

    Whether the release's own parser accepts every flag is `make verify-offline`'s check (flags.router_check).
    """
    text = values.get("ROUTER_ARGS", "")
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise bad(f"ROUTER_ARGS={text!r} is not a list of shell words ({exc}).") from None
    if not args:
        return
    if values["ROUTER"] == "none":
        raise bad("ROUTER_ARGS needs a ROUTER; leave it empty with ROUTER=none.")
    spaced = [a for a in args if any(ch.isspace() for ch in a)]
    if spaced:
        raise bad(
            f"ROUTER_ARGS word {spaced[0]!r} holds a space; the router image splits ROUTER_EXTRA_ARGS on "
            "spaces (images/router/entrypoint.sh), so give each flag and value as plain words."
        )
    owned = [a for a in args if a.split("=", 1)[0] in STACK_ROUTER_FLAGS]
    if owned:
        raise bad(f"ROUTER_ARGS sets {owned[0].split('=', 1)[0]}, which the stack sets itself; remove it.")
    prefix = ROUTERS[values["ROUTER"]]
    table = pins()
    release = RouterRelease(table[f"{prefix}_PACKAGE"], table[f"{prefix}_VERSION"])
    for index, arg in enumerate(args):
        policy = (
            arg.split("=", 1)[1]
            if arg.startswith("--policy=")
            else (args[index + 1] if arg == "--policy" and index + 1 < len(args) else None)
        )
        if arg == "--policy" and policy is None:
            raise bad("ROUTER_ARGS ends with --policy; give it a value.")
        if policy is not None and release.policies and policy not in release.policies:
            raise bad(f"ROUTER_ARGS --policy {policy}: {release.spec} offers {', '.join(release.policies)}.")


def knob(profile: Profile | None, key: str, default: str = "") -> str:
    """A stack knob: the profile's value, else the environment's, else configs/stack.env's, else `default`.
    A value set empty on purpose stays empty (as Compose sees it)."""
    if profile is not None and key in profile.values:
        return profile.values[key]
    if key in os.environ:
        return os.environ[key]
    return parse_env_file(paths.stack_env()).get(key, default)


def _check_ports(values: dict[str, str], bad) -> None:
    """Every port the profile derives is a TCP port, and no two services share one."""
    base, count = int(values["ENGINE_PORT_BASE"]), int(values["ENGINE_COUNT"])
    engines = [base + 10 * i for i in range(count)]  # Profile.engine_port
    if engines[-1] > 65535:
        raise bad(
            f"ENGINE_PORT_BASE={base} puts engine {count - 1} on port {engines[-1]}, beyond 65535; use a base "
            f"at most {65535 - 10 * (count - 1)}."
        )
    if values["ROUTER"] == "none":
        return
    router = int(values["ROUTER_PORT"])
    # The docker runtime gives the router's Prometheus endpoint ROUTER_PORT + 1 (compose.render_values).
    if router + 1 > 65535:
        raise bad(f"ROUTER_PORT={router} must be at most 65534 (ROUTER_PORT + 1 is the router's metrics port).")
    for port in (router, router + 1):
        if port in engines:
            raise bad(
                f"ROUTER_PORT={router} makes the router (or its metrics port {router + 1}) share port {port} "
                f"with engine {engines.index(port)}; pick a ROUTER_PORT outside {engines}."
            )


def load(name: str, *, node_gpus: int | None = None, path: Path | None = None) -> Profile:
    """Load and validate configs/profiles/<name>.env (plus overrides in <name>.local.env, if present)."""
    if path is None:
        path = profiles_dir() / f"{name}.env"
        if not path.exists():
            raise StackError(f"unknown profile {name!r}; choose one of {', '.join(available())}.", ExitCode.USAGE)
    values = parse_env_file(path)
    local = path.with_name(path.stem + ".local.env")
    if local.exists():
        values.update(parse_env_file(local))
    for key in (*REQUIRED, *OPTIONAL):  # the environment overrides a profile value, as Compose does
        if key in os.environ and key not in ("PROFILE_NAME",):
            values[key] = os.environ[key]
    node = node_gpus if node_gpus is not None else parse_node_gpus(os.environ.get("NODE_GPUS"))
    validate(name, path, values, node)
    return Profile(name, path, values, settings={**stack_settings(), **values})


# Knobs a profile's stack reads that configs/stack.env does not list (compose.yaml's defaults apply without them), and
# the smoke's (docs/tool-calls.md; checks.tool_exchange.SMOKE_KNOBS, which tests/unit/train/test_smoke_knobs.py
# holds to these): `make train`'s gate and job, the demos and the benches take them from the profile's settings.
ENVIRONMENT_KNOBS = (
    "HEALTHCHECK_INTERVAL",
    "POLARSTACK_SMOKE_TOOL_PAD",
    "POLARSTACK_SMOKE_TOOL_MAX_TOKENS",
    "POLARSTACK_SMOKE_TIMEOUT",
    "POLARSTACK_SMOKE_AGENT_REQUEST",
)


def stack_settings() -> dict[str, str]:
    """configs/stack.env's knobs and ENVIRONMENT_KNOBS, the environment's value over the file's (`knob`'s rule): the
    stack's settings without a profile (a profile's own values override them: Profile.setting). The CLI's site reads
    them once for the commands that run no profile (polarstack.cli.site.Site.settings)."""
    values = parse_env_file(paths.stack_env())
    for key in (*values, *ENVIRONMENT_KNOBS):
        if key in os.environ:
            values[key] = os.environ[key]
    return values


def stack_knobs() -> dict[str, str]:
    values = parse_env_file(paths.stack_env())
    for key in list(values):  # the environment overrides a knob, as Compose would
        if key in os.environ:
            values[key] = os.environ[key]
    return values


def polar_base_url(profile: Profile, router_url: str | None, engine_urls: list[str]) -> str:
    """Where Polar's requests go in either runtime: the router when POLAR_BASE=router, else engine-0."""
    if profile.polar_base == "router":
        assert router_url is not None, "profiles.validate: POLAR_BASE=router needs a ROUTER"
        return router_url
    return engine_urls[0]


def docker_engine_urls(profile: Profile) -> list[str]:
    """The engines of `profile` under Docker (host network): one per ENGINE_COUNT, at Profile.engine_port."""
    return [f"http://127.0.0.1:{profile.engine_port(i)}" for i in range(profile.engine_count)]


def registered_engines(profile: Profile, engine_urls: list[str]) -> list[str] | None:
    """Engines a check must register itself (POST /workers), as slime does, before it talks to the router.

    Only where slime registers them (ROUTER_REGISTRATION=register) and Polar's base is that router; elsewhere
    the router already knows its workers (static) or Polar talks to an engine."""
    if profile.registration == "register" and profile.polar_base == "router":
        return list(engine_urls)
    return None
