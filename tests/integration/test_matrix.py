"""Pins `polarstack routers matrix` on three real releases: the bisection's key rows are reproduced from the
engine's own request log (0.1.4 and smg 1.13.0 forward Polar's chat fields, 0.3.2 drops them; /generate keeps
its tokens everywhere; only the newer releases take slime's POST /workers)."""

import json

import pytest

from polarstack.cli.main import main

pytestmark = pytest.mark.router


def test_matrix_over_three_releases(tmp_path, capsys):
    out_json, out_md = tmp_path / "m.json", tmp_path / "m.md"
    code = main(
        [
            "routers",
            "matrix",
            "--releases",
            "sglang-router==0.1.4",
            "sglang-router==0.3.2",
            "smg==1.13.0",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ]
    )
    assert code == 0
    rows = {r["release"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert [r.get("note") for r in rows.values()] == [None, None, None]
    assert rows["sglang-router==0.1.4"]["chat_flags_reach_engine"] is True
    assert rows["sglang-router==0.1.4"]["chat_fields_reach_client"] is True
    assert rows["sglang-router==0.3.2"]["chat_flags_reach_engine"] is False
    assert rows["sglang-router==0.3.2"]["chat_fields_reach_client"] is False
    assert rows["sglang-router==0.3.2"]["fields_survive_when_emitted"] is True  # responses pass through
    assert rows["smg==1.13.0"]["chat_flags_reach_engine"] is True
    assert all(r["generate_keeps_tokens"] for r in rows.values())
    assert rows["sglang-router==0.1.4"]["post_workers"] is False
    assert rows["sglang-router==0.3.2"]["post_workers"] is True and rows["smg==1.13.0"]["post_workers"] is True
    assert all(r["latency_requests"] == 200 and "added_median_ms" in r for r in rows.values())
    text = out_md.read_text()
    assert "polarstack routers matrix" in text and "| sglang-router==0.3.2 | yes | yes | no | no |" in text


def test_uninstallable_release_is_a_row(tmp_path, capsys):
    out_json = tmp_path / "m.json"
    assert (
        main(["routers", "matrix", "--releases", "smg==0.0.0", "--json", str(out_json), "--latency-requests", "1"]) == 0
    )
    row = json.loads(out_json.read_text())["rows"][0]
    assert row["installs"] is False and "could not install smg==0.0.0" in row["note"]
