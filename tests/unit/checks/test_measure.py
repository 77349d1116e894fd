"""Pins the measurement helpers probe, the routers matrix and bench share (polarstack.checks.measure): issue #52's body,
the engine-log flag check, the /generate check, interleaved latency and its summary, percentiles."""

from __future__ import annotations

import math

import httpx
import pytest

from polarstack.checks import measure

pytestmark = pytest.mark.unit


def test_issue_52_body_asks_for_polars_fields():
    assert measure.carries_polar_flags(measure.ISSUE_52_BODY)
    assert measure.ISSUE_52_BODY["logprobs"] is True and "model" not in measure.ISSUE_52_BODY


@pytest.mark.parametrize(
    "entries,expected",
    [
        ([], None),
        ([{"path": "/v1/chat/completions"}], None),  # no body logged
        (["junk"], None),
        ([{"body": {"return_prompt_token_ids": True, "return_meta_info": True}}], True),
        ([{"body": {"return_prompt_token_ids": True}}], False),
        ([{"body": {"return_prompt_token_ids": True, "return_meta_info": "true"}}], False),  # only JSON true counts
        ([{"body": {"return_prompt_token_ids": True, "return_meta_info": True}}, {"body": {}}], False),  # the last one
    ],
)
def test_engine_saw_flags(entries, expected):
    assert measure.engine_saw_flags(entries) is expected


def test_generate_body():
    assert measure.generate_body("hi") == {
        "text": "hi",
        "sampling_params": {"max_new_tokens": 4},
        "return_logprob": True,
    }
    assert measure.generate_body("x", temperature=0)["sampling_params"] == {"max_new_tokens": 4, "temperature": 0}


KEPT = {"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-0.1, 1, None]]}}


@pytest.mark.parametrize(
    "parsed,expected",
    [
        (KEPT, True),
        ([KEPT], True),
        ({"output_ids": [1], "meta_info": {}}, False),
        ({"meta_info": KEPT["meta_info"]}, False),
        ({"output_ids": [1], "meta_info": "x"}, False),
        ({}, False),
        (None, None),
        ([], None),
        ("text", None),
    ],
)
def test_generate_keeps_tokens(parsed, expected):
    assert measure.generate_keeps_tokens(parsed) is expected


def test_percentile_interpolates():
    assert measure.percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert measure.percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    assert math.isnan(measure.percentile([], 0.5))


def test_interleaved_latency_alternates_sides_and_keeps_only_successes():
    seen: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(f"{req.url.host}:{req.content.decode()}")
        return httpx.Response(500 if req.url.host == "via.test" and len(seen) == 4 else 200, json={})

    http = httpx.Client(transport=httpx.MockTransport(handle))
    direct, via = measure.interleaved_latency(http, "http://direct.test", "http://via.test", 3, lambda i: {"i": i})
    assert [s.split(":")[0] for s in seen] == ["direct.test", "via.test"] * 3
    assert seen[0].endswith('{"i":0}') and seen[5].endswith('{"i":2}')
    assert len(direct) == 3 and len(via) == 2 and all(ms >= 0 for ms in direct + via)


def test_latency_summary_is_via_minus_direct():
    summary = measure.latency_summary([1.0, 1.0, 1.0], [3.0, 3.0, 5.0])
    assert summary["added_median_ms"] == 2.0 and summary["via_median_ms"] == 3.0
    assert summary["added_p99_ms"] == pytest.approx(measure.percentile([3.0, 3.0, 5.0], 0.99) - 1.0)
    assert list(summary) == [
        "direct_median_ms",
        "via_median_ms",
        "direct_p99_ms",
        "via_p99_ms",
        "added_median_ms",
        "added_p99_ms",
    ]
