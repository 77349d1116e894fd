#!/usr/bin/env python3
"""Record how the pinned ray sizes its object store when `ray start` is given no --object-store-memory
(configs/upstream/ray-object-store.json; issue 32 point 8: the stack sets it and the host memory estimate counts it).

  pip download ray==RAY_VERSION --no-deps -d /tmp/ray
  python scripts/tools/record_ray_object_store.py /tmp/ray/ray-RAY_VERSION-*.whl > configs/upstream/ray-object-store.json

Each fact is an exact substring (needle) of one file of the wheel, the line it is on and that line's text; `value` is
what the stack relies on. `make verify-offline` (polarstack.offline.host_memory) checks that every `ray start` the
stack renders sets --object-store-memory and that the estimate counts it.
"""

from __future__ import annotations

import datetime
import json
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACTS = {  # fact: (file, needle, value)
    "default_proportion": (
        "ray/_private/ray_constants.py",
        '"RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION",',
        "0.3 (the next line) of the memory available at start",
    ),
    "default_proportion_value": ("ray/_private/ray_constants.py", "    0.3,", "0.3"),
    "default_cap": (
        "ray/_private/ray_constants.py",
        '"RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES", (200) * (10**9)',
        "200e9 bytes",
    ),
    "unset_resolves_from_available": (
        "ray/_private/resource_and_label_spec.py",
        "if self.object_store_memory is None:",
        "resolve_object_store_memory(available_memory_bytes)",
    ),
    "available_memory": (
        "ray/_private/resource_and_label_spec.py",
        "available_memory_bytes = ray._private.utils.estimate_available_memory()",
        "available, not total",
    ),
}


def pin(name: str) -> str:
    for line in (ROOT / "configs" / "pins.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"configs/pins.env has no {name}")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel = Path(sys.argv[1])
    version = pin("RAY_VERSION")
    if f"ray-{version}-" not in wheel.name:
        raise SystemExit(f"{wheel.name} is not ray {version} (RAY_VERSION)")
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        for fact, (path, needle, value) in FACTS.items():
            lines = zf.read(path).decode("utf-8").splitlines()
            found = [i for i, line in enumerate(lines, 1) if needle in line]
            if not found:
                raise SystemExit(f"{path} in {wheel.name} has no {needle!r}")
            out[fact] = {"file": path, "needle": needle, "value": value, "line": found[0], "text": lines[found[0] - 1]}
    record = {
        "what": "how the pinned ray sizes its object store without --object-store-memory (record_ray_object_store.py)",
        "ray_version": version,
        "wheel": wheel.name,
        "recorded_on": datetime.date.today().isoformat(),
        "facts": out,
    }
    json.dump(record, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
