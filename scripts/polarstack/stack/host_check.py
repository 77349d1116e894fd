"""What the host must allow for apptainer inside the trainer (issue 18 point 5), checked before `make up`'s long steps.

configs/upstream/apptainer-host.json: a host with kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu 24.04's
default), user.max_user_namespaces=0, or Debian's kernel.unprivileged_userns_clone=0 refuses the user namespace
apptainer needs to start the agent sandbox unprivileged in the trainer, so every agent session would fail; and
Docker must give the trainer /dev/fuse and seccomp and AppArmor unconfined (compose.yaml); never system paths
(the record's not_granted: polarstack.offline.apptainer_userns refuses it).
`POLARSTACK_PROC_SYS` points the check at another /proc/sys tree (tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.pins import repo_root

RECORD = "configs/upstream/apptainer-host.json"
PROC_SYS_ENV = "POLARSTACK_PROC_SYS"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text(encoding="utf-8"))


def userns_problems(proc_sys: Path | None = None, facts: dict[str, Any] | None = None) -> list[str]:
    """One sentence per host sysctl that blocks apptainer's user namespace (a missing file is not a problem)."""
    root = proc_sys or Path(os.environ.get(PROC_SYS_ENV) or "/proc/sys")
    out = []
    for item in (facts or record())["host_sysctls"]:
        try:
            value = (root / item["path"]).read_text().strip()
        except OSError:
            continue
        if value == item["blocks_when"]:
            out.append(
                f"the host sets {item['key']}={value}, which refuses the user namespace apptainer needs to start the "
                f"agent sandbox inside the trainer (every agent session would fail); fix: {item['fix']}"
            )
    return out


def check_before_up() -> None:
    """`make up`: refuse (ENVIRONMENT) before any image is pulled or engine started."""
    problems = userns_problems()
    if problems:
        raise StackError(problems[0] + ".", ExitCode.ENVIRONMENT)


def docker_problems(security_opt: list[str], devices: list[str], facts: dict[str, Any] | None = None) -> list[str]:
    """The trainer's Docker grant against what apptainer needs (verify-offline)."""
    need = (facts or record())["docker"]
    missing = [o for o in need["security_opt"] if o not in security_opt] + [
        d for d in need["devices"] if not any(str(x).split(":")[0] == d for x in devices)
    ]
    return (
        [f"the trainer lacks {', '.join(missing)}, which apptainer needs inside Docker ({RECORD})"] if missing else []
    )


__all__ = ["PROC_SYS_ENV", "RECORD", "check_before_up", "docker_problems", "record", "userns_problems"]
