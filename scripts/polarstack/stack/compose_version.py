"""Is this node's Docker Compose new enough for what the stack's Compose files use?

configs/upstream/compose-features.json (scripts/tools/record_compose_features.py, from docker/compose's and
compose-go's sources and release notes) records the first Compose release with each feature the stack uses and the
minimum that follows: one node needs `required: false` in compose.yaml's depends_on (2.20.2; up to 2.19.1 Compose
rejects the file, 2.20.0-2.20.1 ignore the attribute), NODES>1 also the `!override` tag of the rendered cluster
override (2.24.4; before it the override's lists would be merged, not replaced). Every docker-runtime target checks
it first (compose.check_node) and refuses an older Compose in one sentence (ENVIRONMENT), instead of Compose failing
on the file or starting the wrong services. The record is a floor the node must meet, not a pin the stack installs,
so it lives with the upstream facts, not in configs/pins.env (which holds what the images install).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from polarstack.errors import ExitCode, StackError
from polarstack.pins import repo_root

RECORD = "configs/upstream/compose-features.json"
VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)")


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def parse(text: str) -> tuple[int, int, int] | None:
    """The version `docker compose version` prints: "Docker Compose version v2.40.3", "... 2.20.2+ds1-0ubuntu1"."""
    found = VERSION.search(text or "")
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def needed(multi: bool) -> tuple[str, list[str]]:
    """The minimum for one node (or NODES>1) and the labels of the features that set it."""
    data = record()
    version = data["minimum_multi_node" if multi else "minimum"]
    labels = [
        f["label"] for f in data["features"].values() if f["since"] == version and (multi or f["when"] == "always")
    ]
    return version, labels


def check(command: list[str], *, multi: bool, what: str, alternative: str) -> None:
    """Refuse (ENVIRONMENT) when `command version` reports a Compose older than the recorded minimum; a version it
    cannot read is named on stderr and let through (Compose 2.32.3's release binaries printed none properly: its
    release notes, docs.docker.com/compose/releases/release-notes/#2323)."""
    try:
        proc = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=20)
        output = (proc.stdout or proc.stderr or "").strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        output = str(exc)
    need, labels = needed(multi)
    found = parse(output)
    shown = " ".join(command)
    if found is None:
        print(
            f"polarstack: cannot read the version of Compose from `{shown} version` ({output[:80]!r}); the stack "
            f"needs {need} or newer ({RECORD}).",
            file=sys.stderr,
        )
        return
    if found < parse(need):
        raise StackError(
            f"{what} needs Docker Compose {need} or newer for {' and '.join(labels)}, and `{shown} version` reports "
            f"{'.'.join(map(str, found))}; install a newer Docker Compose plugin (docker-compose-plugin), or "
            f"{alternative}.",
            ExitCode.ENVIRONMENT,
        )
