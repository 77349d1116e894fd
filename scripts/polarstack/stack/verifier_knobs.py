"""The code verifier's environment knobs, as the stack passes them to every place the verifier runs (issue 32 point 4).

The verifier (polarstack.reward.verifier) reads three variables: POLARSTACK_VERIFIER_ISOLATION (limits.py),
POLARSTACK_VERIFIER_CGROUP (cgroup.py) and POLARSTACK_VERIFIER_PYTHON (host.py); its timeout and limits are
command-line arguments and defaults, not environment knobs. In this stack the verifier runs as Polar's test_command
inside the agent sandbox (a SIF), so a knob counts only if it reaches that command's environment:
- POLARSTACK_VERIFIER_ISOLATION (configs/stack.env, overridable from the environment like every stack knob): the
  trainer's environment (compose.yaml), launch.sh's exports, the Ray job's runtime_env and the task template's
  runtime.env (Polar passes it as `env K=V` into every sandbox command; polarstack.train.plan renders all four);
  an active `none` is named by make train, the in-job gate (polarstack.train.gate) and the rehearsal report;
- POLARSTACK_VERIFIER_CGROUP (configs/stack.env): the same places, and only a directory under /sys/fs/cgroup/, the
  one path that is the same inside the SIF: apptainer binds the trainer's /sys into a session started in a user
  namespace (apptainer at APPTAINER_RELEASE, internal/pkg/runtime/engine/apptainer/container_linux.go l.1468-1483, `mount sys`
  defaulting to yes in pkg/util/apptainerconf/config.go l.88), and Polar's `--no-mount cwd,home,bind-paths` keeps it;
- POLARSTACK_VERIFIER_PYTHON: not passed on. It names an interpreter of the machine that sets it; inside the SIF the
  verifier runs the SIF's own python3. The stack's commands refuse it set (for `polarstack verify` on a host only).
"""

from __future__ import annotations

import os

from polarstack.errors import ExitCode, StackError
from polarstack.reward.verifier.cgroup import CGROUP_ENV
from polarstack.reward.verifier.limits import ISOLATION_ENV, ISOLATION_MODES
from polarstack.stack.profiles import stack_knobs

ISOLATION = ISOLATION_ENV
CGROUP = CGROUP_ENV
PYTHON = "POLARSTACK_VERIFIER_PYTHON"
CGROUP_ROOT = "/sys/fs/cgroup/"
PASSED_ON = (ISOLATION, CGROUP)  # what reaches Polar's test_command


def verifier_env(values: dict[str, str] | None = None) -> dict[str, str]:
    """The verifier's knobs as Polar's test_command must see them ({ISOLATION: mode[, CGROUP: dir]}); USAGE for a
    value that is not valid there."""
    values = stack_knobs() if values is None else values
    if os.environ.get(PYTHON):
        raise StackError(
            f"{PYTHON}={os.environ[PYTHON]} is set, but it names an interpreter of this machine and the stack does not "
            "pass it into Polar's sandbox, where the verifier runs the SIF's own python3; unset it (it is for "
            "`polarstack verify` on a host only).",
            ExitCode.USAGE,
        )
    isolation = (values.get(ISOLATION) or "namespaces").strip().lower()
    if isolation not in ISOLATION_MODES:
        raise StackError(
            f"{ISOLATION}={values.get(ISOLATION)!r} is not one of {', '.join(ISOLATION_MODES)} (configs/stack.env or the "
            "environment).",
            ExitCode.USAGE,
        )
    env = {ISOLATION: isolation}
    chosen = (values.get(CGROUP) or "").strip()
    if chosen:
        if not chosen.startswith(CGROUP_ROOT) or "/../" in f"{chosen}/":
            raise StackError(
                f"{CGROUP}={chosen} is not a directory under {CGROUP_ROOT}, the only cgroup path that is the same "
                "inside Polar's sandbox (apptainer mounts the host's /sys); set it to one (docs/tasks.md, \"Limits per "
                'sandbox") or leave it empty for the watchdog.',
                ExitCode.USAGE,
            )
        env[CGROUP] = chosen
    return env


def opted_out(env: dict[str, str]) -> bool:
    return env.get(ISOLATION) == "none"


def opt_out_sentence() -> str:
    return (
        f"{ISOLATION}=none is active: every candidate runs unisolated, on the sandbox's file system with its network, "
        "/tmp and /proc (the evidence protocol still decides the reward; trusted completions only, docs/tasks.md)"
    )
