"""What the stack renders on one node, as one JSON document: every profile's Compose inputs (the rendered env values,
the GPU override, the files `compose_args` passes), every profile x task training plan (`make train DRY_RUN=1
--json`'s plan) and every working profile's rehearsal plan (`make preflight DRY_RUN=1 --json`).

tests/unit/train/test_single_node_unchanged.py compares today's rendering with tests/fixtures/single-node-plans.json,
which this module wrote at the commit before issue 28's multi-node plan (so "single node unchanged" is checked
against what was rendered before, not against itself). When a single-node change is intended, regenerate it:
  .venv/bin/python tests/single_node_snapshot.py > tests/fixtures/single-node-plans.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# The snapshot is of a machine without GPUs (as tests/conftest.py makes every test's): GPU_MEMORY_GB's default.
FIXED_ENV = {
    "POLARSTACK_NVIDIA_SMI": "polarstack-test-no-nvidia-smi",
    "POLARSTACK_PROC_MEMINFO": "/nonexistent/polarstack-test-meminfo",
    # The host's token file (issue 28): a fixed path, since tests/conftest.py points every test at a temporary one.
    "RAY_AUTH_TOKEN_FILE": "/nonexistent/polarstack-snapshot/ray-auth-token",
}
# Knobs the environment could set that would change the rendering (each is read by the code it names).
CLEARED = (
    "GPU_MEMORY_GB",
    "HOST_MEMORY_GB",
    "MODEL_PATH",
    "MODEL_NAME",
    "MODEL_DIR",
    "SERVED_MODEL_NAME",
    "WEIGHT_SYNC_TRANSPORT",
    "WEIGHT_UPDATE_DIR",
    "RAY_DASHBOARD_PORT",
    "POLARSTACK_DEVICE",
    "DEVICE",
    "NODES",
    "NODE_RANK",
    "CLUSTER_IFACE",
    "NODE_ADDRS",
    "HEAD_ADDR",
    "SHARED_DIR",
    "WANDB_API_KEY",
)
RUN_ID = "snapshot"


def render() -> dict[str, Any]:
    from polarstack.paths import load_defaults
    from polarstack.reward.tasks import TASKS
    from polarstack.stack import compose, profiles
    from polarstack.stack.resolved import read_now
    from polarstack.train import preflight
    from polarstack.train.plan import build_plan

    out: dict[str, Any] = {"compose": {}, "train": {}, "preflight": {}}
    where = read_now()  # the device and the cluster as this environment says (no DEVICE, no NODES: one GPU node)
    with tempfile.TemporaryDirectory(prefix="polarstack-snapshot-") as tmp:
        for name in profiles.available():
            profile = profiles.load(name)
            args = compose.compose_args(profile, Path(tmp) / name, cluster=where.cluster, cpu=where.cpu)
            out["compose"][name] = {
                "values": compose.render_values(profile, where.cluster, cpu=where.cpu),
                "gpus": compose.gpu_override(profile),
                "args": [Path(a).name if a.startswith("/") else a for a in args],  # no absolute path
            }
            for task in TASKS:
                plan = build_plan(task, profile, run_id=RUN_ID, config=load_defaults(), cluster=where.cluster)
                out["train"][f"{name}/{task}"] = plan.as_dict()
            if profile.expect == "pass":
                out["preflight"][name] = preflight.build(profile, run_id=RUN_ID, cluster=where.cluster).as_dict()
    return out


def main() -> None:
    for key in CLEARED:
        os.environ.pop(key, None)
    os.environ.update(FIXED_ENV)
    json.dump(render(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
