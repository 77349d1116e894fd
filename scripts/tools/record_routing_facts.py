#!/usr/bin/env python3
"""Record the upstream facts docs/routing.md relies on, from the pinned releases themselves:

- each pinned router's `--policy` choices and the defaults of its cache-aware thresholds (its own argparse
  parser, `python -m MODULE --help` in the release's cached venv, polarstack.routers.harness.install);
- the sglang metrics that tell, on the GPU node, how much of the prompt the engines served from their prefix
  cache (metric names and the line they are declared on in the pinned wheel's
  sglang/srt/observability/metrics_collector.py, and the server flag that turns them on).

Run from the repository with its venv after a pin change:
  .venv/bin/python scripts/tools/record_routing_facts.py > configs/upstream/routing-facts.json
"""

import json
import re
import subprocess
import sys
import zipfile

from polarstack.paths import cache_dir
from polarstack.pins import pins
from polarstack.routers.catalog import RouterRelease
from polarstack.routers.harness import install

METRICS = ("sglang:prompt_tokens_total", "sglang:cached_tokens_total", "sglang:cache_hit_rate")
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
SERVER_ARGS = "sglang/srt/server_args.py"


def router_facts(release: RouterRelease) -> dict:
    python = install(release)
    text = subprocess.run(
        [str(python), "-m", release.module, "--help"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    ).stdout
    policy = re.search(r"--policy \{([a-z_,]+)\}", text)
    # defaults from the release's own parser with no arguments (RouterArgs)
    code = (
        "import json, sys\nfrom {mod} import parse_router_args\na = parse_router_args([])\n"
        "print(json.dumps({{k: getattr(a, k, None) for k in ('policy', 'cache_threshold', "
        "'balance_abs_threshold', 'balance_rel_threshold')}}))"
    ).format(mod=release.module)
    parsed = json.loads(
        subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    return {
        "spec": release.spec,
        "module": release.module,
        "policies": policy.group(1).split(",") if policy else [],
        "defaults": parsed,
    }


def sglang_facts(version: str) -> dict:
    wheel = sorted((cache_dir() / "wheels").glob(f"sglang-{version}-*.whl"))[0]
    with zipfile.ZipFile(wheel) as zf:
        collector = zf.read(COLLECTOR).decode().splitlines()
        server_args = zf.read(SERVER_ARGS).decode().splitlines()
    metrics = {}
    for name in METRICS:
        line = next(i for i, text in enumerate(collector, 1) if f'name="{name}"' in text)
        metrics[name] = {"file": COLLECTOR, "line": line}
    flag = next(i for i, text in enumerate(server_args, 1) if text.strip().startswith("enable_metrics:"))
    return {
        "version": version,
        "wheel": wheel.name,
        "metrics": metrics,
        "enable_metrics": {
            "file": SERVER_ARGS,
            "line": flag,
            "fact": "metrics are exported on /metrics only with --enable-metrics (default off)",
        },
        "cached_tokens_labels": "sglang:cached_tokens_total carries a cache_source label (device, host, "
        "storage_<backend>, or total)",
    }


def main() -> int:
    table = pins()
    routers = [
        router_facts(RouterRelease(table[f"{p}_PACKAGE"], table[f"{p}_VERSION"]))
        for p in ("ROUTER_PASSTHROUGH", "ROUTER_PATCHED", "ROUTER_STOCK")
    ]
    json.dump({"routers": routers, "sglang": sglang_facts(table["SGLANG_VERSION"])}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
