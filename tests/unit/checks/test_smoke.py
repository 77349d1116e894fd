"""Pins the smoke's verdict as Polar's own (issue 11): one named regression per mutation class. Each answer is
served to `run_smoke` through an in-process HTTP transport (no network), as raw bytes, so the literal forms
(NaN, Infinity, 1e999, BOM, UTF-16, lone surrogates, ints beyond 64 bits) reach the smoke unchanged.
Before the verdict model, every case here ended with the wrong exit code or without the finding."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack.checks import exchange, smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode
from smoke_answers import PROSE_MESSAGE, TOOL_ANSWER, answer

pytestmark = pytest.mark.unit
URL = "http://engine.invalid"


TOOL_MESSAGE = json.dumps({"message": TOOL_ANSWER["choices"][0]["message"]})[1:-1].encode()


def serve(monkeypatch, body: bytes):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        if json.loads(request.content).get("tools"):  # the smoke's tool request: an engine with a parser whose
            # answer has the same bytes (and so the same fault) as the others, with the call parsed
            return httpx.Response(
                200, content=body.replace(PROSE_MESSAGE, TOOL_MESSAGE), headers={"content-type": "application/json"}
            )
        return httpx.Response(200, content=body, headers={"content-type": "application/json"})

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))


def smoke_on(monkeypatch, body: bytes | dict, **options) -> exchange.SmokeReport:
    serve(monkeypatch, body if isinstance(body, bytes) else json.dumps(body).encode())
    return smoke.run_smoke(SmokeTarget(URL), SmokeOptions(requests=1, turns=0, **options))


def per_answer(report) -> int:
    """Polar's count on each answer: the single request's and the two tool requests' (same bytes, same fault)."""
    counts = {e["polar"]["polar_trainable_tokens"] for e in report.exchanges if "polar" in e}
    assert [e["kind"] for e in report.exchanges] == ["single", "tools", "tools"] and len(counts) == 1, report.exchanges
    assert report.trainable_tokens == 3 * counts.pop()
    return report.trainable_tokens // 3


def codes(report) -> set[str]:
    return {f["code"] for f in report.findings}


# --- bodies Polar's orjson parser rejects: not trainable, MALFORMED -----------------------------------------


@pytest.mark.parametrize(
    "name,literal", [("nan", "NaN"), ("infinity", "Infinity"), ("minus_infinity", "-Infinity"), ("1e999", "1e999")]
)
def test_number_literals_polar_cannot_parse_are_malformed(monkeypatch, name, literal):
    body = json.dumps(answer()).replace("-0.5,", f"{literal},", 1).encode()
    report = smoke_on(monkeypatch, body)
    assert report.code == ExitCode.MALFORMED and "orjson" in report.message, name


def test_lone_surrogate_is_malformed(monkeypatch):
    body = json.dumps(answer()).replace('"content": "ab"', '"content": "a\\ud800b"').encode()
    assert smoke_on(monkeypatch, body).code == ExitCode.MALFORMED


def test_byte_order_mark_is_malformed(monkeypatch):
    assert smoke_on(monkeypatch, b"\xef\xbb\xbf" + json.dumps(answer()).encode()).code == ExitCode.MALFORMED


def test_utf16_body_is_malformed(monkeypatch):
    assert smoke_on(monkeypatch, json.dumps(answer()).encode("utf-16")).code == ExitCode.MALFORMED


# --- ids beyond 64 bits -------------------------------------------------------------------------------------


def test_prompt_id_beyond_64_bits_fails_polars_trace_model(monkeypatch):
    """orjson parses 2**64 as a float; Trace's list[int] refuses a float that large: zero trainable tokens."""
    report = smoke_on(monkeypatch, answer(prompt=(1, 2**64, 3)))
    assert report.code == ExitCode.INVARIANT and per_answer(report) == 0
    assert "Trace model" in report.message


def test_response_id_beyond_64_bits_is_kept_by_polar_but_blocks_for_the_trainer(monkeypatch):
    """Polar int()s it and keeps the record (2 trainable tokens by its count); slime's int64 tensors cannot."""
    report = smoke_on(monkeypatch, answer(output=((-0.5, 2**64 + 5, "a"), (-0.25, 11, "b"))))
    assert report.code == ExitCode.INVARIANT and report.polar_verdict == "trainable"
    assert "id_beyond_64_bits" in codes(report)


# --- findings Polar does not enforce: warnings, exit 4 only with --strict -----------------------------------


def test_usage_mismatch_is_a_warning(monkeypatch):
    body = answer(usage={"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16})
    report = smoke_on(monkeypatch, body)
    assert report.ok and per_answer(report) == 2 and "usage_mismatch" in codes(report)
    assert smoke_on(monkeypatch, body, strict=True).code == ExitCode.INVARIANT


def test_n2_usage_sums_completion_tokens_over_choices(monkeypatch):
    report = smoke_on(monkeypatch, answer(choices=2))  # sglang: completion_tokens = 2 + 2
    assert report.ok and per_answer(report) == 2
    assert "usage_mismatch" not in codes(report) and "only_first_choice" in codes(report)


def test_logprob_1e_300_above_zero_is_trained(monkeypatch):
    report = smoke_on(monkeypatch, answer(output=((1e-300, 10, "a"), (-0.25, 11, "b"))))
    assert report.ok and per_answer(report) == 2 and "positive_logprob" in codes(report)


@pytest.mark.parametrize(
    "prompt", [(1.0, 2.0, 3.0), ("1", " 2", "+3"), (True, 2, 3)], ids=["integral_floats", "numeric_strings", "booleans"]
)
def test_coerced_prompt_id_types_are_trained_with_a_warning(monkeypatch, prompt):
    report = smoke_on(monkeypatch, answer(prompt=prompt))
    assert report.ok and per_answer(report) == 2 and "coerced_id" in codes(report)


def test_coerced_response_id_types_are_trained_with_a_warning(monkeypatch):
    report = smoke_on(monkeypatch, answer(output=((-0.5, "10", "a"), (-0.25, 11.0, "b"))))
    assert report.ok and per_answer(report) == 2 and "coerced_id" in codes(report)


def test_fractional_prompt_id_fails_the_trace(monkeypatch):
    assert smoke_on(monkeypatch, answer(prompt=(1, 2.5, 3))).code == ExitCode.INVARIANT


# --- issue 12 point 11: token ids of -1, 10**30 and 1000.7, each in prompt and response ids --------------------
# Polar keeps -1 and a response id of 10**30, but slime's trainer cannot (int64 tensors, an embedding lookup in
# [0, vocab)): those block by default; a fractional response id is coerced by Polar (a warning, --strict blocks).


@pytest.mark.parametrize("where", ["prompt", "response"])
def test_negative_id_blocks_because_the_trainer_cannot_embed_it(monkeypatch, where):
    body = answer(prompt=(1, -1, 3)) if where == "prompt" else answer(output=((-0.5, -1, "a"), (-0.25, 11, "b")))
    report = smoke_on(monkeypatch, body)
    assert report.code == ExitCode.INVARIANT and "negative_id" in codes(report) and "trainer" in report.message


def test_id_10_to_the_30_fails_as_a_prompt_id_and_blocks_as_a_response_id(monkeypatch):
    assert smoke_on(monkeypatch, answer(prompt=(1, 10**30, 3))).code == ExitCode.INVARIANT
    report = smoke_on(monkeypatch, answer(output=((-0.5, 10**30, "a"), (-0.25, 11, "b"))))
    assert report.code == ExitCode.INVARIANT and "id_beyond_64_bits" in codes(report)


def test_id_at_the_vocabulary_size_blocks(monkeypatch):
    report = smoke_on(monkeypatch, answer(output=((-0.5, 152064, "a"), (-0.25, 11, "b"))))
    assert report.code == ExitCode.INVARIANT and "id_beyond_vocab" in codes(report)
    assert smoke_on(monkeypatch, answer(output=((-0.5, 152063, "a"),))).ok


def test_id_1000_7_fails_as_a_prompt_id_and_is_coerced_as_a_response_id(monkeypatch):
    assert smoke_on(monkeypatch, answer(prompt=(1, 1000.7, 3))).code == ExitCode.INVARIANT
    report = smoke_on(monkeypatch, answer(output=((-0.5, 1000.7, "a"), (-0.25, 11, "b"))))
    assert report.ok and "coerced_id" in codes(report)
    assert smoke_on(monkeypatch, answer(output=((-0.5, 1000.7, "a"),)), strict=True).code == ExitCode.INVARIANT


def test_only_the_first_choice_is_read(monkeypatch):
    good, bad = answer()["choices"][0], {"index": 1, "message": {"role": "assistant", "content": "x"}}
    body = {**answer(), "choices": [good, bad]}
    report = smoke_on(monkeypatch, body)
    assert report.ok and "only_first_choice" in codes(report)
    assert smoke_on(monkeypatch, {**answer(), "choices": [bad, good]}).code == ExitCode.TOKENS_MISSING


def test_ids_meta_info_length_mismatch_trains_the_aligned_part(monkeypatch):
    body = answer()
    body["choices"][0]["meta_info"]["output_token_logprobs"].pop()  # content keeps 2 entries, meta 1
    report = smoke_on(monkeypatch, body)
    assert report.ok and per_answer(report) == 1 and {"aligned_prefix", "usage_mismatch"} <= codes(report)


def test_null_logprob_in_meta_info_is_zero_trainable(monkeypatch):
    """sglang writes a NaN logprob as null: one null invalidates meta_info's whole list."""
    report = smoke_on(monkeypatch, answer(output=((None, 10, "a"), (-0.25, 11, "b"))))
    assert report.code == ExitCode.INVARIANT and per_answer(report) == 0


def test_json_report_carries_polars_verdict_count_and_warnings(monkeypatch):
    data = smoke_on(monkeypatch, answer(output=((1e-300, 10, "a"),))).as_dict()
    assert data["verdict"] == "pass" and data["polar_verdict"] == "trainable"
    assert (
        data["polar_trainable_tokens"] == 3
        and len(data["requests"]) == 3
        and data["warnings"]
        and data["findings"][0]["code"]
    )
