"""Pins issue 28's promise that one node renders as before: every profile's Compose inputs, every train plan and every
rehearsal plan, rendered now, equal tests/fixtures/single-node-plans.json, which tests/single_node_snapshot.py wrote at
the commit before the multi-node plan existed (branch i28-plan, b276f89). A deliberate single-node change regenerates
the fixture (the command is in the module's docstring) in the same commit that makes it."""

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))

import single_node_snapshot  # noqa: E402


def test_one_node_renders_exactly_as_before(monkeypatch, tmp_path):
    for key in single_node_snapshot.CLEARED:
        monkeypatch.delenv(key, raising=False)
    for key, value in single_node_snapshot.FIXED_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("POLARSTACK_RUN_DIR", str(tmp_path / "run"))
    now = json.loads(json.dumps(single_node_snapshot.render(), sort_keys=True))
    before = json.loads((ROOT / "tests" / "fixtures" / "single-node-plans.json").read_text())
    assert set(now) == set(before)
    for section in before:
        assert set(now[section]) == set(before[section]), section
        for name in before[section]:
            assert now[section][name] == before[section][name], (
                f"{section}/{name} differs from the single-node snapshot"
            )


def test_the_snapshot_covers_every_profile_task_and_rehearsal():
    before = json.loads((ROOT / "tests" / "fixtures" / "single-node-plans.json").read_text())
    from polarstack.reward.tasks import TASKS
    from polarstack.stack import profiles

    names = profiles.available()
    assert set(before["compose"]) == set(names)
    assert set(before["train"]) == {f"{n}/{t}" for n in names for t in TASKS}
    assert set(before["preflight"]) == {n for n in names if profiles.load(n).expect == "pass"}
    # what it pins is the loopback plan: every address in it is 127.0.0.1
    text = json.dumps(before)
    assert "--actor-num-nodes 1 " in text and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in text
    assert "SHARED_DIR" not in text
    # NCCL and Gloo on loopback, never a cluster interface (issue 34 point 3)
    named = re.findall(r"(?:NCCL|GLOO)_SOCKET_IFNAME[=\\\": ]+([A-Za-z0-9_.-]+)", text)
    assert named and set(named) == {"lo"}, set(named)
