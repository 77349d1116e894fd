"""The two committed router matrices (docs/router-matrix.json in front of the emulator, docs/router-matrix-sglang.json
in front of the real pinned sglang) measure the same releases and agree on every yes/no column: the emulator's
request-log answers are sglang's (issue 21 point 4). Regenerating one with a different answer fails here."""

import json

import pytest

from polarstack.bench import matrix
from polarstack.pins import repo_root

pytestmark = pytest.mark.unit

YES_NO = [key for key, _ in matrix.COLUMNS if key not in ("release", "startup_s") and not key.endswith("_ms")]


def _rows(name: str) -> dict[str, dict]:
    return {r["release"]: r for r in json.loads((repo_root() / "docs" / name).read_text())["rows"]}


def test_the_real_engine_matrix_agrees_with_the_emulator_matrix():
    emulated, real = _rows("router-matrix.json"), _rows("router-matrix-sglang.json")
    assert sorted(real) == sorted(emulated) and len(real) >= 30
    differing = {
        release: {k: (emulated[release].get(k), real[release].get(k)) for k in YES_NO}
        for release in real
        if any(emulated[release].get(k) != real[release].get(k) for k in YES_NO)
    }
    assert not differing, differing
    assert all(r["engine"] == "sglang" for r in real.values())
    # the bisection itself, from sglang: 0.1.4 forwards Polar's fields, 0.1.5 drops them; smg 1.4.1 drops, 1.5.0 forwards
    assert [real[s]["chat_flags_reach_engine"] for s in ("sglang-router==0.1.4", "sglang-router==0.1.5")] == [
        True,
        False,
    ]
    assert [real[s]["chat_flags_reach_engine"] for s in ("smg==1.4.1", "smg==1.5.0")] == [False, True]


def test_the_real_engine_report_names_its_engine():
    record = json.loads((repo_root() / "docs" / "router-matrix-sglang.json").read_text())
    assert record["engine"].startswith("sglang==")
    assert "recording relay" in (repo_root() / "docs" / "router-matrix-sglang.md").read_text()
