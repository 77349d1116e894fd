"""Pins the diagnostics of Polar's token contract: which response shapes yield trainable tokens, and why the others
do not.

Behaviour under test mirrors Polar's SGLangEngine.normalize_response and record_utils.build_trace_from_completion
(polar.model's reading, guarded; see scripts/polarstack/polar/diagnostics.py); the property test pins that any JSON
value gives a verdict, never an exception.
"""

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polarstack.polar import diagnostics, model

pytestmark = pytest.mark.unit


def sglang_response(prompt=(1, 2, 3), output=((-0.5, 10, "a"), (-0.25, 11, "b")), with_prompt=True, with_meta=True):
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab"},
        "logprobs": {"content": [{"token": t, "bytes": [], "logprob": lp, "top_logprobs": []} for lp, _, t in output]},
        "finish_reason": "stop",
        "matched_stop": 151645,
    }
    if with_prompt:
        choice["prompt_token_ids"] = list(prompt)
    if with_meta:
        choice["meta_info"] = {
            "id": "x",
            "output_token_logprobs": [list(e) for e in output],
            "completion_tokens": len(output),
        }
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output), "total_tokens": 0},
    }


def test_full_sglang_response_is_trainable():
    verdict = diagnostics.diagnose(sglang_response())
    assert verdict.prompt_ids == [1, 2, 3]
    assert verdict.response_ids == [10, 11]
    assert verdict.logprobs == [-0.5, -0.25]
    assert verdict.trainable_tokens == 2
    assert verdict.problems == []
    assert verdict.prompt_source == "choices[0].input_token_ids"  # after Polar's normalization


def test_router_stripped_response_names_both_missing_fields():
    verdict = diagnostics.diagnose(sglang_response(with_prompt=False, with_meta=False))
    assert verdict.trainable_tokens == 0
    text = " ".join(p.message for p in verdict.missing)
    assert "return_prompt_token_ids" in text and "return_meta_info" in text
    assert "token_id" in text  # the OpenAI logprobs fallback fails too


def test_top_level_prompt_ids_and_token_ids_path():
    response = sglang_response(with_prompt=False, with_meta=False)
    response["prompt_token_ids"] = [7, 8]
    response["usage"]["prompt_tokens"] = 2
    choice = response["choices"][0]
    choice["token_ids"] = [10, 11]
    for entry, tid in zip(choice["logprobs"]["content"], [10, 11], strict=False):
        entry["token_id"] = tid
    verdict = diagnostics.diagnose(response)
    assert verdict.prompt_ids == [7, 8] and verdict.prompt_source == "prompt_token_ids"
    assert verdict.response_ids == [10, 11] and verdict.logprobs == [-0.5, -0.25]
    assert verdict.trainable_tokens == 2


def test_meta_entries_as_dicts():
    response = sglang_response()
    response["choices"][0]["meta_info"]["output_token_logprobs"] = [
        {"token_id": 10, "logprob": -0.5},
        {"token_id": 11, "token_logprob": -0.25},
    ]
    assert diagnostics.diagnose(response).response_ids == [10, 11]


def test_one_bad_meta_entry_invalidates_the_whole_list():
    response = sglang_response()
    response["choices"][0]["meta_info"]["output_token_logprobs"][1] = [None, 11, "b"]
    verdict = diagnostics.diagnose(response)
    assert verdict.trainable_tokens == 0
    assert any("output_token_logprobs[1]" in p.message for p in verdict.missing)


@pytest.mark.parametrize("value,expected", [(math.nan, "not finite"), (0.5, "above 0"), (math.inf, "not finite")])
def test_bad_logprob_values_are_invariant_violations(value, expected):
    response = sglang_response(output=((-0.5, 10, "a"), (value, 11, "b")))
    verdict = diagnostics.diagnose(response)
    assert verdict.trainable_tokens == 0
    assert any(expected in p.message for p in verdict.violations)


def test_usage_mismatch_is_reported():
    response = sglang_response()
    response["usage"]["completion_tokens"] = 5
    response["usage"]["prompt_tokens"] = 9
    messages = [p.message for p in diagnostics.diagnose(response).violations]
    assert any("usage.completion_tokens is 5" in m for m in messages)
    assert any("usage.prompt_tokens is 9" in m for m in messages)


def test_token_ids_stamped_onto_same_length_logprobs_content():
    # Polar's _stamp_token_ids_onto_logprobs pairs token_ids with a content list of the same length.
    response = sglang_response(with_meta=False)
    response["choices"][0]["token_ids"] = [10, 11]
    verdict = diagnostics.diagnose(response)
    assert verdict.logprobs == [-0.5, -0.25] and verdict.trainable_tokens == 2


def test_token_ids_without_aligned_logprobs_are_a_violation():
    response = sglang_response(with_meta=False)
    response["choices"][0]["token_ids"] = [10, 11]
    response["choices"][0]["logprobs"]["content"].pop()  # truncated content: no stamping, no pairing
    verdict = diagnostics.diagnose(response)
    assert verdict.response_ids == [10, 11] and verdict.logprobs is None
    assert any("RolloutLogprobError" in p.message for p in verdict.violations)


def test_non_int_prompt_id_is_a_violation():
    response = sglang_response(prompt=(1, "2", 3))
    verdict = diagnostics.diagnose(response)
    assert verdict.trainable_tokens == 0
    assert any("is '2', not an int" in p.message for p in verdict.violations)


def test_sglext_only_is_reported_but_not_counted():
    response = sglang_response(with_prompt=False, with_meta=False)
    response["sglext"] = {"input_ids": [1, 2, 3], "output_ids": [10, 11]}
    verdict = diagnostics.diagnose(response)
    assert verdict.trainable_tokens == 0
    assert any(p.kind == diagnostics.WARNING and "sglext" in p.message for p in verdict.problems)


def test_diagnose_does_not_mutate_the_response():
    response = sglang_response()
    before = copy.deepcopy(response)
    diagnostics.diagnose(response)
    assert response == before


def test_prefix_check():
    assert diagnostics.check_prefix([1, 2], [1, 2, 3]) is None
    problem = diagnostics.check_prefix([1, 2, 3], [1, 9, 3, 4])
    assert problem is not None and "token 1" in problem.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "prompt_token_ids",
                    "input_token_ids",
                    "token_ids",
                    "meta_info",
                    "logprobs",
                    "content",
                    "token_id",
                    "logprob",
                    "output_token_logprobs",
                    "usage",
                    "prompt_tokens",
                    "completion_tokens",
                    "sglext",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_any_json_value_gives_a_verdict(value):
    verdict = diagnostics.diagnose(value)
    assert verdict.trainable_tokens >= 0
    assert isinstance(verdict.as_dict()["problems"], list)
    if verdict.trainable_tokens == 0:
        assert verdict.problems, "a zero verdict must say why"


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_the_guarded_normalize_never_raises_and_agrees_with_polars_where_it_does_not(value):
    guarded = model.normalize_guarded(value)
    if not isinstance(value, dict):
        assert guarded is None
        return
    try:
        strict = model.normalize(value)
    except OverflowError:  # Polar's normalize_response raises here (int(inf), float of an int beyond a double)
        return
    assert json.dumps(guarded, sort_keys=True) == json.dumps(strict, sort_keys=True)  # NaN-safe equality


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 150000), min_size=1, max_size=20),
    st.lists(st.tuples(st.floats(-20, 0), st.integers(0, 150000)), min_size=1, max_size=20),
)
def test_wellformed_responses_always_count_every_response_token(prompt, output):
    response = sglang_response(prompt=prompt, output=[(lp, tid, None) for lp, tid in output])
    verdict = diagnostics.diagnose(response)
    assert verdict.trainable_tokens == len(output)
    assert verdict.prompt_ids == prompt
