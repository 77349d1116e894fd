"""What the GPU stack needs besides images: model weights and the agent sandbox (docs/gpu-node.md).

Weights reach the engines one of two ways:
- `make model`: the one-shot `model-download` service runs `hf download MODEL_NAME` into the `models` volume
  (resumable), checks every file against the sizes and hashes the Hub lists, and writes MODEL_MARKER next to
  the weights. Engines depend on that service completing (compose.yaml), so it re-checks on every `make up`.
- `MODEL_DIR=/path`: weights already on the host, bind-mounted read-only at MODEL_PATH by a rendered Compose
  override (.run/compose/<profile>.model.yaml); `model-download` then only checks them (`--check-only`).

The agent sandbox (Polar's `apptainer` runtime, `claude_code` harness) needs, in the `models` volume,
SIF_PATH (python3, git, node and the pinned agent CLI) and AGENT_CLI_DIR (node + the CLI, mounted into every
sandbox at /opt/node through the task template's runtime.kwargs.volumes), built by `make sif`; and apptainer
in the trainer image. `make up` and `make train` refuse with one sentence naming what is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from polarstack.errors import ExitCode, StackError
from polarstack.paths import compose_file, load_defaults, load_yaml
from polarstack.pins import pins, repo_root
from polarstack.reward import sandbox  # the sandbox's paths on the node, read at call time
from polarstack.stack import device, host_check
from polarstack.stack.profiles import stack_knobs

MODEL_VOLUME = "polarstack_models"  # compose.yaml: project `polarstack`, volume `models`
MODEL_MARKER = ".polarstack-model.json"  # written by the model-download service once the files check out
SANDBOX_PROFILE = "sandbox"  # the Compose profile of the one-shot sandbox-build service


def knobs() -> dict[str, str]:
    return stack_knobs()


def model_dir(values: dict[str, str] | None = None) -> Path | None:
    raw = (values if values is not None else knobs()).get("MODEL_DIR", "").strip()
    return Path(raw) if raw else None


def model_path(values: dict[str, str] | None = None) -> str:
    return (values if values is not None else knobs()).get("MODEL_PATH") or "/models/Qwen2.5-7B-Instruct"


def image(service: str) -> str:
    table = pins()
    return {
        "model-download": f"polarstack/model-download:{table['HF_HUB_REQUIREMENT'].partition('==')[2]}",
        "sandbox-build": f"polarstack/sandbox:{table['AGENT_CLI_VERSION']}",
        "trainer": f"polarstack/trainer:{table['SLIME_COMMIT']}",
    }[service]


def engine_services(profile_name: str) -> list[str]:
    """engine-N services of compose.yaml active in `profile_name`, in order."""
    spec = load_yaml(compose_file().read_text())
    names = [
        name
        for name, svc in spec["services"].items()
        if name.startswith("engine-") and profile_name in (svc.get("profiles") or [])
    ]
    return sorted(names, key=lambda n: int(n.split("-")[1]))


# --- MODEL_DIR: weights already on the host -------------------------------------------------------------------


def check_model_files(directory: Path) -> list[str]:
    """What is missing from a Hugging Face model directory (config.json, every safetensors shard)."""
    import json

    if not directory.is_absolute():
        return [f"{directory} is not an absolute path"]
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    problems = []
    if not (directory / "config.json").is_file():
        problems.append(f"{directory}/config.json is missing")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, OSError):
            return problems + [f"{index} is not a safetensors index (no weight_map)"]
        for shard in shards:
            path = directory / shard
            if not path.is_file() or path.stat().st_size == 0:
                problems.append(f"{path} (listed in model.safetensors.index.json) is missing or empty")
    elif not (directory / "model.safetensors").is_file():
        problems.append(f"{directory} has neither model.safetensors nor model.safetensors.index.json")
    return problems


def model_override(profile, directory: Path) -> Path | None:
    """With MODEL_DIR set: a Compose override binding it read-only at MODEL_PATH; None otherwise."""
    values = knobs()
    host = model_dir(values)
    override = directory / f"{profile.name}.model.yaml"
    if host is None:
        override.unlink(missing_ok=True)
        return None
    if not host.is_absolute():
        raise StackError(f"MODEL_DIR={host} must be an absolute path on this host.", ExitCode.USAGE)
    target = model_path(values)
    if not PurePosixPath(target).is_relative_to("/models") or target.rstrip("/") == "/models":
        raise StackError(
            f"MODEL_PATH={target} must be a directory under /models for MODEL_DIR to be mounted there.", ExitCode.USAGE
        )
    # model-download mounts the volume read-write and runs first (engines depend on it), so the bind's mount point
    # exists in the volume before the engines mount it read-only.
    bind = {"type": "bind", "source": str(host), "target": target, "read_only": True}
    services: dict[str, Any] = {name: {"volumes": [bind]} for name in [*engine_services(profile.name), "trainer"]}
    # The weights are there already: check them, download nothing.
    services["model-download"] = {"volumes": [bind], "command": ["--check-only"]}
    directory.mkdir(parents=True, exist_ok=True)
    override.write_text(
        "# Rendered from MODEL_DIR (configs/stack.env or the environment). Do not edit.\n"
        + yaml.safe_dump({"services": services}, sort_keys=False)
    )
    return override


# --- checks before `make up` / `make train` -------------------------------------------------------------------


def _docker(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(["docker", *args], 127, "", str(exc))


def _missing_in_volume(paths: list[str]) -> list[str] | None:
    """Which of `paths` the models volume lacks, looked up with one throw-away container of a polarstack image.

    None when no polarstack image exists yet to look with (nothing was ever built or downloaded)."""
    if _docker(["volume", "inspect", MODEL_VOLUME]).returncode != 0:
        return list(paths)
    for service in ("model-download", "sandbox-build", "trainer"):
        ref = image(service)
        if _docker(["image", "inspect", ref]).returncode != 0:
            continue
        script = 'for f in "$@"; do [ -e "$f" ] || echo "$f"; done'
        proc = _docker(
            [
                "run",
                "--rm",
                "--pull",
                "never",
                "--network",
                "none",
                "--entrypoint",
                "sh",
                "-v",
                f"{MODEL_VOLUME}:/models:ro",
                ref,
                "-c",
                script,
                "check",
                *paths,
            ]
        )
        if proc.returncode == 0:
            return [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return None


def missing_sentence(verb: str, missing: list[str], values: dict[str, str]) -> str:
    name = values.get("MODEL_NAME") or "the model"
    fixes = []
    what = []
    if "weights" in missing:
        what.append(f"the weights of {name} (no {MODEL_MARKER} in the models volume)")
        fixes.append(
            "`make model` (downloads them; HF_TOKEN passes through if the model needs one) or set "
            "MODEL_DIR=/path/to/weights you already have"
        )
    if "sif" in missing or "agent-cli" in missing:
        parts = [
            p
            for p, key in (
                (f"{sandbox.SIF_PATH}", "sif"),
                (f"{sandbox.AGENT_CLI_DIR}/bin/{sandbox.AGENT_CLI_BIN}", "agent-cli"),
            )
            if key in missing
        ]
        what.append("the agent sandbox (" + " and ".join(parts) + ")")
        fixes.append("`make sif`")
    if "apptainer" in missing:
        what.append("apptainer in the trainer image")
        fixes.append("`make build` (the trainer image installs APPTAINER_RELEASE)")
    return f"make {verb} needs {' and '.join(what)}, which are missing: run {', then '.join(fixes)}."


def _check_context(host: Path) -> None:
    """The model's context (config.json max_position_embeddings) must hold context.seq_length (polarstack.checks.budget)."""
    import json

    try:
        native = json.loads((host / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return
    seq = load_defaults()["context"]["seq_length"]
    if isinstance(native, int) and native < seq:
        raise StackError(
            f"MODEL_DIR={host} holds a model with max_position_embeddings={native}, below "
            f"context.seq_length={seq} (configs/train/defaults.yaml); lower seq_length or use the "
            "model it was sized for.",
            ExitCode.USAGE,
        )


def check_before_up(profile, *, cpu: bool) -> None:
    """Refuse `make up` (ExitCode.ASSETS_MISSING) when weights or the agent sandbox are absent. `cpu`: DEVICE=cpu (the
    site's device, handed down by the docker runtime and the rehearsal)."""
    host_check.check_before_up()  # the host's user-namespace sysctls first: ENVIRONMENT, before any long step
    if cpu:
        check_before_up_cpu()
        return
    values = knobs()
    missing: list[str] = []
    host = model_dir(values)
    paths = [sandbox.SIF_PATH, f"{sandbox.AGENT_CLI_DIR}/bin/{sandbox.AGENT_CLI_BIN}"]
    if host is not None:
        problems = check_model_files(host)
        if problems:
            raise StackError(
                f"MODEL_DIR={host} does not hold usable weights ({problems[0]}); point MODEL_DIR at the "
                "directory with config.json and the safetensors shards, or unset it and run `make model`.",
                ExitCode.ASSETS_MISSING,
            )
        _check_context(host)
    else:
        paths.insert(0, f"{model_path(values)}/{MODEL_MARKER}")
    absent = _missing_in_volume(paths)
    if absent is None:
        absent = paths
    if host is None and paths[0] in absent:
        missing.append("weights")
    if sandbox.SIF_PATH in absent:
        missing.append("sif")
    if f"{sandbox.AGENT_CLI_DIR}/bin/{sandbox.AGENT_CLI_BIN}" in absent:
        missing.append("agent-cli")
    trainer = image("trainer")
    if _docker(["image", "inspect", trainer]).returncode == 0:
        proc = _docker(
            [
                "run",
                "--rm",
                "--pull",
                "never",
                "--network",
                "none",
                "--entrypoint",
                "sh",
                trainer,
                "-c",
                "command -v apptainer",
            ]
        )
        if proc.returncode != 0:
            missing.append("apptainer")
    if missing:
        raise StackError(missing_sentence("up", missing, values), ExitCode.ASSETS_MISSING, details=missing)


def check_before_up_cpu(say=lambda s: print(f"polarstack: {s}", file=sys.stderr)) -> None:
    """DEVICE=cpu: the checks that can run (the host's sysctls, MODEL_DIR's files and context), the others skipped
    by name: the agent sandbox (`make sif` is node-only) and apptainer (a GitHub release asset)."""
    values = knobs()
    host = model_dir(values)
    problems = check_model_files(host) if host is not None else ["MODEL_DIR is not set"]
    if problems:
        raise StackError(
            f"make up DEVICE=cpu serves the tiny model bound as MODEL_DIR, and it is not usable ({problems[0]}); "
            "rerun `make up DEVICE=cpu`, which builds it.",
            ExitCode.ASSETS_MISSING,
        )
    for key in ("sandbox", "apptainer"):
        say(f"skipped: {device.SKIPPED_ON_CPU[key]}")


# --- the sandbox the way Polar starts it (the probe of it before `make train`: polarstack.checks.sandbox_probe) ----------
# Polar's apptainer runtime (configs/upstream/polar-apptainer.json, read from src/polar/runtime/apptainer.py):
# without POLAR_APPTAINER_NO_INSTANCE it uses `apptainer instance start` + `exec instance://`, which its docstring
# says cannot re-enter a nested user namespace; with it, one long-lived direct `apptainer exec` per session runs
# every agent and evaluator command. The trainer container is such a nested setup, so the stack sets it wherever
# Polar runs (compose.yaml trainer environment, launch.sh, the Ray job) and verify-offline checks that it does.
# POLAR_APPTAINER_NO_MOUNT_TMP goes with it everywhere: apptainer binds the trainer's /tmp into every session by
# default (`mount tmp = yes`, configs/upstream/apptainer-userns.json), where Polar keeps the other sessions'
# directories (their hidden tests) and Ray its /tmp/ray; with it Polar adds `tmp` to --no-mount.
# POLAR_APPTAINER_CLEANENV goes with them: apptainer passes Polar's whole environment into every session unless
# --cleanenv (configs/upstream/apptainer-userns.json environment_without_cleanenv), and the trainer's holds
# WANDB_API_KEY for slime's W&B logging; with it a session gets only what Polar passes as `env K=V` (runtime.env,
# the harness's and the evaluator's env). POLAR_APPTAINER_ISOLATE_IPC too: the trainer shares the host's IPC
# namespace (ipc: host, NCCL with the engines); with it every session has its own (--ipc). Not
# POLAR_APPTAINER_ISOLATE_PID: with --pid apptainer mounts a fresh procfs, which the kernel refuses under Docker's
# masked /proc, so no session would start (configs/upstream/apptainer-userns.json fresh_proc_with_pid_namespace).


def apptainer_record() -> dict[str, Any]:
    import json

    return json.loads((repo_root() / "configs" / "upstream" / "polar-apptainer.json").read_text())


SWITCHES = ("mode", "no_mount_tmp", "cleanenv", "isolate_ipc")  # the record's <name>_env / <name>_value pairs


def sandbox_mode_env() -> dict[str, str]:
    """The environment that selects Polar's direct-exec apptainer mode and keeps the trainer's /tmp and its
    environment out of every session (configs/upstream/polar-apptainer.json)."""
    record = apptainer_record()
    return {record[f"{name}_env"]: record[f"{name}_value"] for name in SWITCHES}


def pass_through_secrets(path: Path | None = None) -> list[str]:
    """The variables compose.yaml (or `path`) hands the trainer from the caller's environment, never written (no value
    in the file): secrets for the trainer's own processes (WANDB_API_KEY for slime's W&B logging)."""
    spec = load_yaml((path or compose_file()).read_text())
    environment = (spec["services"].get("trainer") or {}).get("environment") or {}
    return sorted(key for key, value in environment.items() if value is None)


def _truthy(environment: dict[str, Any], name: str) -> bool:
    """Polar's _env_truthy on `environment` (configs/upstream/polar-apptainer.json mode_env_truthy)."""
    return str(environment.get(name) or "").strip().lower() in apptainer_record()["mode_env_truthy"]


def no_mount(environment: dict[str, Any]) -> str:
    """The --no-mount list Polar's ApptainerRuntime._runtime_options builds from `environment` (read at the revision
    configs/upstream/polar-apptainer.json names): cwd,home,bind-paths, then hostfs and tmp when their env is truthy."""
    names = ["cwd", "home", "bind-paths"]
    names += ["hostfs"] if _truthy(environment, "POLAR_APPTAINER_NO_MOUNT_HOSTFS") else []
    names += ["tmp"] if _truthy(environment, apptainer_record()["no_mount_tmp_env"]) else []
    return ",".join(names)


def runtime_flags(environment: dict[str, Any]) -> list[str]:
    """The flags Polar's ApptainerRuntime._runtime_options adds after --no-mount from `environment`, in its order
    (configs/upstream/polar-apptainer.json runtime_options): --cleanenv, --pid, --ipc when their env is truthy."""
    switches = (("POLAR_APPTAINER_CLEANENV", "--cleanenv"), ("POLAR_APPTAINER_ISOLATE_PID", "--pid"))
    switches += (("POLAR_APPTAINER_ISOLATE_IPC", "--ipc"),)
    return [flag for name, flag in switches if _truthy(environment, name)]


def mode_problems(environment: dict[str, Any], where: str) -> list[str]:
    """Why Polar, run with `environment`, would use its instance mode, which cannot nest in the trainer container,
    or bind the trainer's /tmp or its environment into the sessions."""
    record = apptainer_record()
    found = []
    if not _truthy(environment, record["mode_env"]):
        found.append(
            f"{where} does not set {record['mode_env']}={record['mode_value']}: Polar's apptainer runtime then uses "
            "`apptainer instance start` + `exec instance://`, which cannot re-enter the nested user namespace of the "
            "trainer container (configs/upstream/polar-apptainer.json), so every rollout would fail"
        )
    if not _truthy(environment, record["no_mount_tmp_env"]):
        found.append(
            f"{where} does not set {record['no_mount_tmp_env']}={record['no_mount_tmp_value']}: apptainer then binds "
            "the trainer's /tmp into every agent session (`mount tmp = yes`), where an agent reads the other "
            "sessions' hidden tests (eval/problem.json) and can delete them and Ray's /tmp/ray "
            "(configs/upstream/polar-apptainer.json)"
        )
    if not _truthy(environment, record["cleanenv_env"]):
        found.append(
            f"{where} does not set {record['cleanenv_env']}={record['cleanenv_value']}: apptainer then passes Polar's "
            "whole environment into every agent session (no --cleanenv), WANDB_API_KEY among it "
            "(configs/upstream/polar-apptainer.json cleanenv)"
        )
    if not _truthy(environment, record["isolate_ipc_env"]):
        found.append(
            f"{where} does not set {record['isolate_ipc_env']}={record['isolate_ipc_value']}: every agent session then "
            "shares the trainer's IPC namespace, the host's (ipc: host), and can remove the System V shared memory "
            "and semaphores of the engines and NCCL (configs/upstream/polar-apptainer.json isolation)"
        )
    return found
