"""docs/exposure.md's single-node table against the records it rests on (node-path review, finding 2): torch's TCPStore
binds every interface whatever host it is given (configs/upstream/multinode-facts.json `tcpstore_measured`), so the
one-node table must list the trainer's store as not kept on loopback, on the port range slime's recorded line picks
(`master_port_range`), with the firewall rule for that range; and the engines' own stores, inferred and not measured,
as long as compose.yaml gives sglang no fixed dist-init port. (The "Multi-node listeners" table is checked row for row
by tests/cluster/test_netns_cluster.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.static

ROOT = Path(__file__).resolve().parents[2]
EXPOSURE = ROOT / "docs" / "exposure.md"
RECORD = ROOT / "configs" / "upstream" / "multinode-facts.json"


def single_node_rows() -> dict[str, list[str]]:
    """The first table of docs/exposure.md (before "## Ports"), by its first cell."""
    table = EXPOSURE.read_text().split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0]] = cells
    return rows


def row(prefix: str) -> list[str]:
    found = [cells for name, cells in single_node_rows().items() if name.startswith(prefix)]
    assert len(found) == 1, f"docs/exposure.md's single-node table has {len(found)} rows starting {prefix!r}"
    return found[0]


def test_the_recorded_store_listens_on_every_interface():
    stores = json.loads(RECORD.read_text())["tcpstore_measured"]["stores"]
    assert stores and all(s["host_name"] == "127.0.0.1" and s["listening"] == ["*"] for s in stores), (
        "the TCPStore measurement changed: reword the TCPStore rows of docs/exposure.md"
    )


def test_the_trainers_store_is_a_row_on_slimes_port_range():
    text = json.loads(RECORD.read_text())["slime"]["master_port_range"]["found"][0]["text"]
    low, high = re.search(r"randint\((\d+), (\d+)\)", text).groups()
    cells = row("torch TCPStore of the trainer")
    assert "every interface" in cells[1] and "not kept on loopback" in cells[1]
    assert f"random.randint({low}, {high})" in cells[1] and "measured" in cells[2]
    assert f"--dport {low}:{high} ! -i lo -j DROP" in EXPOSURE.read_text()


def test_the_engines_stores_are_a_row_marked_not_measured():
    compose = yaml.safe_load((ROOT / "compose" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        command = [str(a) for a in service.get("command") or []]
        assert "--nccl-port" not in command and "--dist-init-addr" not in command, (
            f"{name} now gets a fixed dist-init port: docs/exposure.md's engine TCPStore row says it has none"
        )
    cells = row("torch TCPStore of each engine")
    assert "not measured" in cells[1] and "not measured" in cells[2]
    assert "model_runner.py` l.1272-1281" in cells[1]
