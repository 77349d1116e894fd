#!/usr/bin/env python3
"""Record which router releases accept --prometheus-host and what they bind the metrics port to by default.

  .venv/bin/python scripts/tools/record_router_prometheus_host.py [--wheels DIR] > configs/upstream/router-prometheus-host.json

For every release in polarstack.routers.catalog.MEASURED, downloads the wheel (`pip download --no-deps`, kept in DIR,
default ~/.cache/polarstack/router-wheels), parses the release's own argument definitions (launch_router.py /
router_args.py) with `ast`, and records whether `--prometheus-port` and `--prometheus-host` are defined and the
default of `--prometheus-host`. The catalog (RouterRelease.accepts_prometheus_host) must agree with this record
(tests/unit/routers/test_harness.py); the pinned releases are also started and their sockets listed
(tests/integration/test_exposure.py).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from polarstack.paths import cache_dir
from polarstack.routers.catalog import MEASURED, version_tuple

SOURCES = ("launch_router.py", "router_args.py")


def _option(node: ast.Call) -> str | None:
    if not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    if isinstance(first, ast.JoinedStr):  # f"--{prefix}prometheus-host": keep the literal tail
        return "".join(v.value for v in first.values if isinstance(v, ast.Constant))
    return None


def options(source: str) -> dict[str, object]:
    """{option tail: default} of every add_argument(...) call in `source`."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            name = _option(node)
            if name and "prometheus" in name:
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                found[name.lstrip("-")] = default.value if isinstance(default, ast.Constant) else None
    return found


def record(package: str, version: str, wheels: Path) -> dict[str, object]:
    target = wheels / f"{package}-{version}"
    if not list(target.glob("*.whl")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "-d",
                str(target),
                f"{package}=={version}",
            ],
            check=True,
            capture_output=True,
        )
    wheel = next(target.glob("*.whl"))
    found: dict[str, object] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(SOURCES) and name.count("/") == 1:
                found.update(options(archive.read(name).decode("utf-8")))
    return {
        "release": f"{package}=={version}",
        "wheel": wheel.name,
        "prometheus_port": "prometheus-port" in found,
        "prometheus_host": "prometheus-host" in found,
        "prometheus_host_default": found.get("prometheus-host"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=cache_dir() / "router-wheels")
    args = parser.parse_args()
    rows = [
        record(package, version, args.wheels)
        for package, version in sorted(MEASURED, key=lambda pv: (pv[0], version_tuple(pv[1])))
    ]
    json.dump(
        {
            "what": "--prometheus-port / --prometheus-host in each measured router release's own argument "
            "definitions (default None: the Rust side binds 0.0.0.0, measured for smg 1.13.0)",
            "recorded_on": datetime.date.today().isoformat(),
            "recorded_with": "scripts/tools/record_router_prometheus_host.py",
            "releases": rows,
        },
        sys.stdout,
        indent=1,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
