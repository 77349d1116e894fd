"""Polar's token rules as DATA: each field path of an engine answer and what the pinned Polar does with it.

A second description of the behaviour polar/model.py implements step by step, written independently as a table
so that tests can interpret it (tests/unit/polar/test_model.py) and compare both on many generated answers: a
bug would have to be made twice, in two different forms, to go unnoticed. Sources as in polar/model.py
(proxy.py / engine.py at POLAR_COMMIT; record_utils.py 93a0f757; models.py 467f2ab2; adapter.py 063c9482).

Coercion names used below:
- "int()":  Python's int() on the value; TypeError/ValueError make the whole list unusable (record_utils,
            engine.py). It accepts bools, truncates fractional floats and parses decimal strings with blanks,
            a sign and underscores.
- "float()": Python's float() on the value (accepts numeric strings, "NaN", "inf").
- "lax_int": pydantic's lax int for Python input (Trace.prompt_ids: list[int]): ints, bools, finite floats with
            no fractional part, decimal strings (blanks, sign, underscores); anything else fails the trace.
"""

from __future__ import annotations

# Step 1: Polar's gateway reads the answer with orjson.loads (proxy.py InferenceClient._completion).
PARSE = {
    "parser": "orjson.loads",
    "encoding": "utf-8",  # bytes must be UTF-8: UTF-16 and invalid sequences are rejected
    "byte_order_mark": "reject",
    "constants": "reject",  # NaN, Infinity, -Infinity literals
    "float_overflow": "reject",  # a number that is infinite as a double (1e999)
    "lone_surrogates": "reject",  # "\ud800" escapes without their pair
    "control_characters_in_strings": "reject",
    "max_depth": 1024,
    "integer_range": (-(2**63), 2**64 - 1),  # integers outside it are parsed as floats (not rejected)
    "top_level": "object",  # anything else raises inside normalize_response (response.pop)
}

# Steps 2-4: where the trace's ids and logprobs come from, in priority order, and how each value is coerced.
PROMPT_IDS = {
    "sources": ("choices[0].input_token_ids", "choices[0].prompt_token_ids", "prompt_token_ids"),
    "select": "first_truthy",  # record_utils: a `or` b `or` c
    "must_be": "list",  # otherwise re-tokenized from the request's messages (tokenizer configured) or empty
    "element": "lax_int",  # Trace model validation: one bad element fails the whole trace
    "retokenize_check": "usage.prompt_tokens",  # a re-tokenized prompt is kept only if it matches usage
}

RESPONSE_SOURCES = (
    # 1. meta_info's triples; normalize_response turns them into token_ids + logprobs.content[] (all or nothing).
    {
        "path": "choices[0].meta_info.output_token_logprobs",
        "non_empty": True,
        "all_or_nothing": True,
        "item_shapes": {
            "list": {"logprob": 0, "token_id": 1, "min_length": 2},
            "dict": {"token_id": "token_id", "logprob": ("logprob", "token_logprob")},
        },
        "token_id": "int()",
        "logprob": "float()",
        "null": "invalid",
    },
    # 2. explicit token ids (the choice's key wins over the top-level one even when null); logprobs only from a
    #    candidate (content after stamping, then meta) whose ids are exactly these.
    #    normalize_response stamps only the choice's own token_ids (never the top-level ones) onto content.
    {
        "path": "choices[0].token_ids",
        "fallback_path": "token_ids",
        "all_or_nothing": True,
        "token_id": "int()",
        "logprobs": "identical_candidate",
        "stamped_from": "token_ids",
    },
    # 3. OpenAI logprobs content whose items all carry token_id and logprob (plain sglang sends no token_id;
    #    normalize_response stamps token_ids onto same-length content).
    {
        "path": "choices[0].logprobs.content",
        "non_empty": True,
        "all_or_nothing": True,
        "token_id": "int()",
        "logprob": "float()",
        "null": "invalid",
    },
    # 4. re-tokenizing the content[].token text: only when the builder has a tokenizer; the count must equal
    #    usage.completion_tokens (sglang's sum over all choices when n >= 2).
    {
        "path": "choices[0].logprobs.content[].token",
        "requires": "tokenizer",
        "retokenize_check": "usage.completion_tokens",
    },
)

IGNORED = {
    "usage": "never read, except to accept a re-tokenized prompt or response",
    "choices[1:]": "never read (only the first choice becomes a trace)",
    "sglext": "not read by the pinned Polar",
}

# Steps 5-6: the slime bridge adapter and the group check.
ADAPTER = {
    "drop_trace_if": ("empty prompt ids", "empty response ids"),
    "group_error_if": ("no logprobs for trainable tokens",),  # RolloutLogprobError
    "trainable_tokens": "len(response ids)",  # loss_mask = [1] * len(response_ids), clipped to max_tokens
}

# Step 7 (issue 18 point 8): the gateway delivers the session result to the rollout server as JSON
# (src/polar/gateway/node.py GatewayNodeManager._push_result at POLAR_COMMIT: `result.model_dump(mode="json")` then
# httpx `post(callback_url, json=payload)`, whose encoder runs json.dumps with allow_nan=False). A non-finite float
# in the trace (a logprob parsed from "nan"/"inf" by float()) raises "Out of range float values are not JSON
# compliant" there, which _push_result logs and does not retry: the result is lost, nothing is trained.
DELIVER = {
    "serializer": "json.dumps(allow_nan=False)",
    "lost_if": ("a non-finite logprob",),
}
