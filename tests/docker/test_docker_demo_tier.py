"""`make demo RUNTIME=docker` on a real engine (issue 27 point 4): every profile through Docker (DEVICE=cpu, real sglang in
containers built from images/engine/Dockerfile, real router wheels in router containers) gives the same table as
`make demo`: the three working profiles pass with trainable tokens, stock-router fails with TOKENS_MISSING naming both of
Polar's request fields; the engines start once and nothing of the demo's project is left afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from polarstack.checks import docker_demo
from polarstack.polar.contract import POLAR_REQUEST_FLAGS
from polarstack.stack import profiles

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]


def test_every_profile_through_docker_behaves_as_documented(docker_engine):
    env = {**os.environ, "DOCKER_HOST": docker_engine}
    env.pop("DEVICE", None)  # the demo sets DEVICE=cpu and its own project and ports itself
    proc = subprocess.run(
        [sys.executable, "-m", "polarstack", "demo", "--runtime", "docker", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    rows = {row["profile"]: row for row in result["rows"]}
    assert set(rows) == set(profiles.PROFILE_ORDER)
    assert all(row["as_expected"] for row in rows.values()), rows
    for name in ("engine-direct", "router-passthrough", "patched-router"):
        assert rows[name]["verdict"] == "pass" and rows[name]["trainable_tokens"] > 0, rows[name]
    stock = rows["stock-router"]
    assert stock["verdict"] == "TOKENS_MISSING" and stock["trainable_tokens"] == 0
    assert set(stock["fields_missing"]) >= set(POLAR_REQUEST_FLAGS), stock
    assert proc.stderr.count("demo: engines up (once for every profile)") == 1
    assert docker_demo.containers_of(docker_demo.DEMO_PROJECT) == []  # torn down
    print(f"docker tier: the docker demo took {result['elapsed_seconds']} s", file=sys.stderr)
