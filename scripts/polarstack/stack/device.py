"""DEVICE=cpu for the Docker runtime: the same Compose file and code path as the node, on a machine without a GPU.

`make build|up|smoke|train|down DEVICE=cpu` export POLARSTACK_DEVICE=cpu. Then, and only then:
- Compose gets compose/compose.cpu.yaml after compose.yaml: the changes this machine forces, each commented there
  (no GPU reservations, the engines' CPU arguments, the tiny model bound as MODEL_DIR, memlock within the hard
  limit, the CPU bases of polarstack.stack.bases, builds on the host network);
- the stack is its own: Compose project CPU_PROJECT (so its containers and volumes never touch a user's real stack),
  run state .run/docker-state.cpu.json, and ports of its own (CPU_PORTS, each overridable from the environment as on
  the node), so it never collides with the node stack, the local runtime or the local real-engine tests;
- the steps that need the node are skipped by name, never silently (SKIPPED_ON_CPU): the agent sandbox (`make sif`
  needs node 22 and apptainer from GitHub) and Polar's second opinion inside the trainer (Polar installs from
  GitHub only).
"""

from __future__ import annotations

import functools
import os

from polarstack.engine import tool_parser
from polarstack.errors import ExitCode, StackError
from polarstack.stack import bases, real_sglang

DEVICE_ENV = "POLARSTACK_DEVICE"
DEVICES = ("gpu", "cpu")
CPU_PROJECT = "polarstack-cpu"  # POLARSTACK_CPU_PROJECT overrides it (the docker test tier: one per session)
CPU_STATE_FILE = "docker-state.cpu.json"
# Ports of the CPU stack (host networking, as on the node): clear of the node's defaults (30000, 30080, 6379, 8265).
CPU_PORTS = {
    "ENGINE_PORT_BASE": "31000",
    "ROUTER_PORT": "31080",
    "RAY_GCS_PORT": "31379",
    "RAY_DASHBOARD_PORT": "31265",
}
# The engines' healthcheck start period on the CPU: the real sglang with the tiny model was ready in 48-175 s here
# (docs/cpu-engines.md, "The real engine on the CPU"; the slower figures with other work on the 2 cores).
CPU_ENGINE_START_PERIOD = "240s"
CPU_HEALTHCHECK_INTERVAL = "2s"
CPU_MODEL_PATH = "/models/tiny-qwen2"  # where compose.cpu.yaml's MODEL_DIR bind puts the tiny model
SKIPPED_ON_CPU = {
    "sandbox": "the agent sandbox check (SIF and agent CLI): skipped on DEVICE=cpu, `make sif` runs only on the "
    "node (node 22 and apptainer come from GitHub)",
    "apptainer": "apptainer in the trainer image: skipped on DEVICE=cpu, its .deb is a GitHub release asset",
    "polar": "Polar's second opinion inside the trainer: skipped on DEVICE=cpu, Polar installs from GitHub only",
}


def current() -> str:
    """POLARSTACK_DEVICE: gpu (unset) or cpu, USAGE otherwise. Read by the site (polarstack.cli.site) and by
    read_now() (polarstack.stack.resolved); everything below them is handed the device (`cpu`) by its caller."""
    value = (os.environ.get(DEVICE_ENV) or "gpu").strip().lower()
    if value not in DEVICES:
        raise StackError(
            f"DEVICE={value} is not gpu or cpu; use DEVICE=cpu on a machine without a GPU.", ExitCode.USAGE
        )
    return value


def make_words(cpu: bool) -> str:
    """What advice adds to a `make` command so that it names the stack of the caller's device (`cpu`: DEVICE=cpu, as
    the site resolved it): ` DEVICE=cpu` on the CPU stack."""
    return " DEVICE=cpu" if cpu else ""


def project(cpu: bool) -> str:
    """The Compose project name of the docker runtime on the caller's device (`cpu`: DEVICE=cpu)."""
    return _cpu_project() if cpu else "polarstack"


def _cpu_project() -> str:
    return os.environ.get("POLARSTACK_CPU_PROJECT") or CPU_PROJECT


def state_file_for(name: str) -> str:
    """The run-state file's name of the docker runtime on device `name` (gpu or cpu): one per Compose project on
    DEVICE=cpu (the demo and the test tier have their own)."""
    if name != "cpu":
        return "docker-state.json"
    return CPU_STATE_FILE if _cpu_project() == CPU_PROJECT else f"docker-state.{_cpu_project()}.json"


def apply_cpu_defaults() -> None:
    """For DEVICE=cpu (its caller knows: the site, the docker demo): the CPU stack's ports and model path as
    environment defaults (the environment still wins)."""
    for key, value in CPU_PORTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MODEL_PATH", CPU_MODEL_PATH)
    os.environ.setdefault("ENGINE_START_PERIOD", CPU_ENGINE_START_PERIOD)
    # The CPU stack is brought up and swapped by the demo and the docker tier, whose wall time is mostly the wait
    # for each container's first passing check: poll every 2 s, not the node's 15 s (a check costs a python3 start).
    os.environ.setdefault("HEALTHCHECK_INTERVAL", CPU_HEALTHCHECK_INTERVAL)
    os.environ.setdefault("MODEL_DIR", str(real_sglang.model_dir()))  # the tiny model (built by `make up DEVICE=cpu`)


# --- `make build|up DEVICE=cpu`: what the CPU stack needs before Compose runs -------------------------------------


def prepare(progress=print) -> None:
    """The CPU bases (cached) and the tiny model the engines serve (built once from the host's sglang install)."""
    bases.make_all(progress)
    real_sglang.build_model(progress)


def tool_record(release) -> dict:
    """The smoke's scripted tool answer for real engines (as the local real-engine runtime records it,
    polarstack.stack.local.up): a random model never calls a tool unless its answer is scripted."""
    return {
        "tool_fields": _scripted_tool_answer(),
        "tool_unscripted": real_sglang.script_unreachable(release),
        "device": "cpu",
    }


@functools.cache
def _scripted_tool_answer() -> dict:
    """Computed once per process (two runs of the sglang venv's python): the demo records it for every profile."""
    return real_sglang.scripted_answer(tool_parser.smoke_call_text())
