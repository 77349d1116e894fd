"""Pins the smoke's exchange record (exchange.Exchange): its row in the JSON report's `requests` has the keys in the
order the report has always had (kind, turn, url, status, elapsed_ms, bytes, then verdict, polar, installed_polar
and the tool outcome only once known), never the smoke's own prompt ids or request body; rows read by key as the
JSON does; the report's trainable tokens are the sum of Polar's counts."""

from __future__ import annotations

import pytest

from polarstack.checks.exchange import Exchange, SmokeReport
from polarstack.checks.route import Resolution
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget

pytestmark = pytest.mark.unit


def entry(**known) -> Exchange:
    return Exchange(
        kind="single", turn=1, url="http://e.invalid/v1/chat/completions", status=200, elapsed_ms=1.5, bytes=10, **known
    )


def test_a_failed_exchange_is_its_six_transport_keys():
    row = entry(prompt_ids=[1, 2], request={"model": "m"}).as_dict()
    assert list(row) == ["kind", "turn", "url", "status", "elapsed_ms", "bytes"]
    assert row["elapsed_ms"] == 1.5 and row["bytes"] == 10


def test_known_parts_follow_in_order_and_private_ones_never_appear():
    polar = {"polar_trainable_tokens": 3}
    row = entry(
        verdict={"problems": []},
        polar=polar,
        installed_polar={"trainable_tokens": 3, "ended": "kept"},
        tool_outcome="parsed",
        tool_calls=1,
        finish_reason=None,
        prompt_ids=[1],
        request={"m": 1},
    ).as_dict()
    assert list(row) == [
        "kind",
        "turn",
        "url",
        "status",
        "elapsed_ms",
        "bytes",
        "verdict",
        "polar",
        "installed_polar",
        "tool_outcome",
        "tool_calls",
        "finish_reason",
        "padded",
        "prompt_tokens",
    ]
    assert row["finish_reason"] is None and row["polar"] is polar
    assert list(entry(verdict={}, polar=polar).as_dict())[-2:] == ["verdict", "polar"]


def test_rows_read_by_key_like_the_json_report():
    e = entry(polar={"polar_trainable_tokens": 2})
    assert e["polar"]["polar_trainable_tokens"] == 2 and e["kind"] == "single"
    assert "polar" in e and "installed_polar" not in e and "prompt_ids" not in e
    assert e.get("verdict", {}) == {} and e.get("url") == e.url
    with pytest.raises(KeyError):
        e["request"]


def test_report_rows_and_trainable_tokens():
    url = "http://e.invalid"
    report = SmokeReport(SmokeTarget(url), SmokeOptions(), Resolution("base", url, [url]), "m")
    report.exchanges = [entry(polar={"polar_trainable_tokens": 2}), entry(polar={"polar_trainable_tokens": 5}), entry()]
    data = report.as_dict()
    assert data["requests"] == [e.as_dict() for e in report.exchanges]
    assert report.trainable_tokens == data["polar_trainable_tokens"] == 7
    assert data["installed_polar"] == "not importable"
    report.exchanges[0].installed_polar = {"trainable_tokens": 2, "ended": "kept"}
    assert report.as_dict()["installed_polar"] == "agrees"
