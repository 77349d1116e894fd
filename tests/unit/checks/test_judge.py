"""Pins the smoke's go/no-go (polarstack.checks.judge.judge) on recorded exchanges, without any HTTP: Polar's count
decides; a disagreement with the installed Polar is INTERNAL; zero-token answers are TOKENS_MISSING naming the
dropped request fields (or INVARIANT when the fields are there); answers Polar trains on only by re-tokenizing are
RETOKENIZED after the drift measurement unless allowed; trainer-fatal findings block, other findings warn (block
with strict). The verdict and Polar dicts are built by diagnostics.diagnose and polar_model.decide."""

from __future__ import annotations

import json

import pytest

from polarstack.checks import judge as smoke_judge
from polarstack.checks.exchange import Exchange, SmokeReport
from polarstack.checks.route import Resolution
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.errors import ExitCode
from polarstack.polar import contract, diagnostics
from polarstack.polar import model as polar_model
from polarstack.polar.verdict import NOT_TRAINABLE, RETOKENIZED, TRAINABLE

pytestmark = pytest.mark.unit
URL = "http://engine.invalid"
REQUEST = contract.prepare_request({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def answer(output=((-0.5, 10, "a"), (-0.25, 11, "b")), prompt=(1, 2, 3), ids=True, meta=True, usage=None) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab"},
        "finish_reason": "stop",
        "logprobs": {"content": [{"token": t, "logprob": lp, "top_logprobs": []} for lp, _, t in output]},
    }
    if ids:
        choice["prompt_token_ids"] = list(prompt)
    if meta:
        choice["meta_info"] = {"output_token_logprobs": [list(e) for e in output]}
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
        "usage": usage
        or {"prompt_tokens": len(prompt), "completion_tokens": len(output), "total_tokens": len(prompt) + len(output)},
    }


def exchange(body: dict, url: str = URL, kind: str = "single", **known) -> Exchange:
    raw = json.dumps(body).encode()
    entry = Exchange(kind=kind, turn=1, url=url, status=200, elapsed_ms=1.0, bytes=len(raw), **known)
    entry.verdict = diagnostics.diagnose(json.loads(raw)).as_dict()
    entry.polar = polar_model.decide(raw, REQUEST).as_dict()
    return entry


def judged(*exchanges: Exchange, bypassed: bool = False, **options) -> tuple[SmokeReport, list]:
    resolution = Resolution(
        "polar" if bypassed else "base",
        URL,
        sorted({e.url for e in exchanges}),
        bypassed=bypassed,
        note="the router is bypassed" if bypassed else "",
    )
    report = SmokeReport(SmokeTarget(URL), SmokeOptions(**options), resolution, "m", exchanges=list(exchanges))
    drift_calls: list[SmokeReport] = []
    smoke_judge.judge(report, drift_calls.append)
    return report, drift_calls


def test_trainable_answers_pass_with_polars_count():
    report, drift_calls = judged(exchange(answer()), exchange(answer()))
    assert report.code == ExitCode.OK and report.polar_verdict == TRAINABLE
    assert report.message == f"4 trainable tokens (Polar's count) from 2 responses via {URL}"
    assert drift_calls == [] and report.warnings == []


def test_a_bypassed_router_is_a_warning():
    report, _ = judged(exchange(answer()), bypassed=True)
    assert report.ok and report.warnings == ["the router is bypassed"]


@pytest.mark.parametrize(
    "ids,meta,lost",
    [
        (False, False, ["return_prompt_token_ids", "return_meta_info"]),
        (False, True, ["return_prompt_token_ids"]),
        (True, False, ["return_meta_info"]),
    ],
    ids=["both", "prompt_ids", "meta_info"],
)
def test_zero_tokens_without_the_fields_is_tokens_missing_naming_them(ids, meta, lost):
    report, _ = judged(exchange(answer()), exchange(answer(ids=ids, meta=meta), url="http://other.invalid"))
    assert report.code == ExitCode.TOKENS_MISSING and report.fields_missing == lost
    assert report.polar_verdict == NOT_TRAINABLE
    assert "from http://other.invalid carries" in report.message and smoke_judge.WORKING_PROFILES in report.message


def test_zero_tokens_with_the_fields_present_is_invariant():
    report, _ = judged(exchange(answer(output=((None, 10, "a"), (-0.25, 11, "b")))))
    assert report.code == ExitCode.INVARIANT and report.fields_missing == []
    assert "although the token fields are there" in report.message and f"from {URL}" in report.message


def test_a_disagreement_with_the_installed_polar_is_internal():
    report, _ = judged(exchange(answer(), installed_polar={"trainable_tokens": 0, "ended": "trace"}))
    assert report.code == ExitCode.INTERNAL
    assert "2 trainable tokens vs Polar's 0, which ended at trace" in report.message


def retokenized_exchange() -> Exchange:
    entry = exchange(answer())
    entry.polar["polar_verdict"] = RETOKENIZED
    return entry


def test_retokenized_answers_are_refused_after_measuring_drift():
    resolution = Resolution("base", URL, [URL])
    options = SmokeOptions(tokenizer_name="tok")
    report = SmokeReport(SmokeTarget(URL), options, resolution, "m", exchanges=[retokenized_exchange()])

    def measure(r):
        r.drift = {"sampled_tokens": 10, "differing_positions": 3}

    smoke_judge.judge(report, measure)
    assert report.code == ExitCode.RETOKENIZED and report.polar_verdict == RETOKENIZED
    assert "'tok'" in report.message and "3 of 10 tokens differ" in report.message
    assert "--allow-retokenized" in report.message


def test_retokenized_answers_pass_when_allowed_with_a_warning():
    report, drift_calls = judged(retokenized_exchange(), allow_retokenized=True)
    assert report.ok and len(drift_calls) == 1
    assert report.warnings[-1].startswith("retokenized:") and "drift not measured" in report.warnings[-1]


def test_a_trainer_fatal_finding_blocks():
    report, _ = judged(exchange(answer(output=((-0.5, -1, "a"), (-0.25, 11, "b")))))
    assert report.code == ExitCode.INVARIANT and "the trainer cannot" in report.message
    assert "negative_id" in {f["code"] for f in report.findings}


def test_other_findings_warn_and_block_only_with_strict():
    usage = {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}
    one, _ = judged(exchange(answer(usage=usage)))
    report, _ = judged(exchange(answer(usage=usage)), exchange(answer(usage=usage)))
    assert report.ok and report.findings == one.findings  # each (code, path) once, not once per answer
    assert {f["code"] for f in report.findings} == {"usage_mismatch"}
    assert sum(w.startswith("usage_mismatch: ") for w in report.warnings) == len(report.findings) > 0
    assert f"{len(report.findings)} warning(s) Polar does not enforce" in report.message
    strict, _ = judged(exchange(answer(usage=usage)), strict=True)
    assert strict.code == ExitCode.INVARIANT and strict.message.startswith("--strict: ")


def test_fail_sets_code_and_message():
    report = SmokeReport(SmokeTarget(URL), SmokeOptions(), Resolution("base", URL, [URL]), "m")
    assert smoke_judge.fail(report, ExitCode.HTTP_ERROR, "no") is report
    assert (report.code, report.message) == (ExitCode.HTTP_ERROR, "no")
