"""Polar's control-plane token (review point 6): given to Polar's two servers, and only where no agent session can read it.

At POLAR_COMMIT the rollout server checks POLAR_CONTROL_PLANE_TOKEN (header X-Polar-Control-Token) on node
registration, heartbeats and session results, and the gateway on session dispatch (configs/upstream/polar-facts.json
control_plane): with it an agent's shell can no longer post a forged session result, register a gateway of its own
or dispatch sessions, though the other routes stay open. Each server sends it to the other when it holds it, so both
hold it or neither. slime's driver needs none: the bridge sends it only on task submission, which the rollout server
checks only for the spilot_router harness, so the Ray job's environment (and its `ray job submit` command line, which
every session's /proc shows) never carries it.

The gateway starts every session with its own environment, and apptainer passes it in unless --cleanenv, which Polar
adds when POLAR_APPTAINER_CLEANENV is truthy; apptainer's own processes beside a session keep only the environment
SetContainerEnv computed (configs/upstream/apptainer-starter-env.json). So the token is given only when the
environment launch.sh runs Polar's servers with sets that switch; otherwise launch.sh says why it gives none.

launch.sh makes a fresh token per attempt (each attempt starts its own two servers) in a shell variable: never
exported, printed, written to a file, or put on a command line (a session shares the trainer's PID namespace and
reads every /proc/<pid>/cmdline); the two server lines get it as a prefix assignment, which reaches their environment
alone.
"""

from __future__ import annotations

import json
from typing import Any

from polarstack.paths import repo_root
from polarstack.stack import assets

RECORD = "configs/upstream/polar-facts.json"
VARIABLE = "polar_control_token"  # launch.sh's shell variable (not exported)
# 32 random bytes as 64 hex digits, made inside the trainer by Python's secrets module (os.urandom).
MAKE = f"{VARIABLE}=$(python3 -c 'import secrets; print(secrets.token_hex(32))')"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())["control_plane"]


def cleanenv(environment: dict[str, Any]) -> bool:
    """Whether Polar, run with `environment`, passes --cleanenv to apptainer (its _env_truthy of the switch,
    configs/upstream/polar-apptainer.json mode_env_truthy)."""
    name = record()["sessions"]["cleanenv_env"]
    return str(environment.get(name) or "").strip().lower() in assets.apptainer_record()["mode_env_truthy"]


def launch_lines(environment: dict[str, Any]) -> tuple[list[str], str]:
    """launch.sh's lines before Polar's servers start, and the prefix of each server's command: the token when
    `environment` (what launch.sh runs Polar's servers with) keeps the gateway's environment out of the sessions."""
    env = record()["env"]
    if not cleanenv(environment):
        switch = record()["sessions"]["cleanenv_env"]
        return [
            f"# No {env} for Polar's servers: without {switch} every agent session would inherit it from the gateway",
            "# (polarstack.train.control_plane, docs/exposure.md).",
        ], ""
    return [
        f"# {env}: a fresh token for this attempt's two Polar servers alone (the rollout server checks it on node",
        "# registration, heartbeats and session results, the gateway on dispatch); never exported, printed or written,",
        "# and kept out of the sessions by --cleanenv (polarstack.train.control_plane, docs/exposure.md).",
        MAKE,
    ], f'{env}="${VARIABLE}" '


__all__ = ["MAKE", "RECORD", "VARIABLE", "cleanenv", "launch_lines", "record"]
