"""verify-offline: the host memory estimate counts what the node really gives and Ray really takes (issue 32 point 8).

- configs/upstream/ray-object-store.json (scripts/tools/record_ray_object_store.py) records that the pinned ray,
  given no --object-store-memory, sizes its object store as 0.3 x the memory available at start (up to 200 GB): an
  amount the estimate cannot know. So every `ray start` the stack renders (compose.yaml's trainer, its NODES>1
  override, launch.sh's fallback) must set --object-store-memory to RAY_OBJECT_STORE_GB, and the host estimate must
  count exactly that;
- the host's capacity is /proc/meminfo's MemAvailable, not MemTotal (checked on a fake meminfo where they differ).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from polarstack.offline.check import Check
from polarstack.pins import pins, repo_root
from polarstack.stack import ray_head
from polarstack.train import memory

RECORD = "configs/upstream/ray-object-store.json"


def record() -> dict[str, Any]:
    return json.loads((repo_root() / RECORD).read_text())


def record_problems(data: dict[str, Any]) -> list[str]:
    problems = []
    if data.get("ray_version") != pins()["RAY_VERSION"]:
        problems.append(f"{RECORD} was recorded for ray {data.get('ray_version')}, not RAY_VERSION; rerecord it")
    facts = data["facts"]
    proportion, value = facts["default_proportion"], facts["default_proportion_value"]
    number = re.fullmatch(r"\s*([0-9.]+),\s*", value["text"])
    if value["line"] != proportion["line"] + 1 or not number or not 0 < float(number.group(1)) <= 1:
        problems.append(
            f"{RECORD}: ray's default object store is no longer a proportion of the memory available at start "
            f"({proportion['file']} l.{proportion['line']})"
        )
    if "available" not in facts["available_memory"]["text"]:
        problems.append(f"{RECORD}: ray no longer sizes the default object store from the available memory")
    return problems


def _store_flags(command: list[str]) -> list[str]:
    return [a.split("=", 1)[1] for a in command if a.startswith("--object-store-memory=")]


def rendered_problems(plan_head: list[str], values: dict[str, str]) -> list[str]:
    """`plan_head`: launch.sh's fallback `ray start` of a rendered plan; `values`: configs/stack.env's knobs."""
    problems = []
    want = str(ray_head.object_store_bytes(values))
    compose_yaml = yaml.safe_load((repo_root() / "compose" / "compose.yaml").read_text())
    trainer = [str(a) for a in compose_yaml["services"]["trainer"]["command"]]
    expected = f"${{{ray_head.OBJECT_STORE_BYTES}:?rendered from {ray_head.OBJECT_STORE_KNOB}}}"
    if _store_flags(trainer) != [expected]:
        problems.append(
            f"compose.yaml's trainer `ray start` does not set --object-store-memory={expected}: ray would size its "
            f"object store itself (0.3 x the memory available, {RECORD})"
        )
    if _store_flags(plan_head) != [want]:
        problems.append(
            f"launch.sh's fallback `ray start` sets --object-store-memory={_store_flags(plan_head)}, not {want} "
            f"({ray_head.OBJECT_STORE_KNOB})"
        )
    for name, command in (
        ("head", ray_head.head_command(gcs_port=1, dashboard_port=2, num_gpus=1, object_store_bytes=want)),
        (
            "worker",
            ray_head.worker_command(
                head_addr="10.0.0.1", gcs_port=1, node_ip="10.0.0.2", num_gpus=1, object_store_bytes=want
            ),
        ),
    ):
        if _store_flags(command) != [want]:
            problems.append(f"ray_head's {name} command drops --object-store-memory")
    return problems


def counted_problems(plan: memory.MemoryPlan, values: dict[str, str]) -> list[str]:
    gb = ray_head.object_store_gb(values)
    terms = [t for t in plan.host if "--object-store-memory" in t.name]
    if len(terms) != 1 or abs(terms[0].gb - gb) > 1e-9:
        return [f"the host memory estimate does not count Ray's object store ({gb} GB, {ray_head.OBJECT_STORE_KNOB})"]
    return []


def meminfo_problems() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meminfo"
        path.write_text("MemTotal:       1000000 kB\nMemFree:         100000 kB\nMemAvailable:    400000 kB\n")
        got = memory.host_memory_kib(path)
    if got != 400000:
        return [f"the host's capacity is read as {got} kB from a meminfo with MemAvailable 400000 kB, MemTotal 1000000"]
    return []


def check(plan_head: list[str], plan: memory.MemoryPlan, values: dict[str, str]) -> Check:
    problems = record_problems(record()) + rendered_problems(plan_head, values) + counted_problems(plan, values)
    problems += meminfo_problems()
    return Check(
        f"host memory: MemAvailable, Ray's object store set by the stack and counted ({RECORD})",
        not problems,
        f"--object-store-memory={ray_head.object_store_bytes(values)}",
        problems,
    )


__all__ = ["check", "record", "record_problems", "rendered_problems", "counted_problems", "meminfo_problems"]
