"""Pins the verdict model (polarstack.polar.model) against a second, independent description of Polar's rules
written as data (polarstack.polar.rules), interpreted here by code that shares nothing with the model: the
oracle parses with the standard library under the table's orjson rules and coerces with the table's named
coercions. A hypothesis property test compares both on thousands of generated answers (raw bytes, including
NaN/Infinity/1e999 literals, BOM, UTF-16, lone surrogates, ids beyond 64 bits, odd id types, null logprobs, n >= 2).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polarstack.polar import model as polar_model
from polarstack.polar import rules as polar_rules
from polarstack.polar.verdict import NOT_TRAINABLE, UNPARSEABLE

pytestmark = pytest.mark.unit
EXAMPLES = 3000  # generated answers per run (measured run time in docs/polar-verdict.md)

# --- the oracle: an interpreter of polar_rules ---------------------------------------------------------------

_LAX_STR = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")


class Rejected(Exception):
    pass


def _reject(*_):
    raise Rejected


def oracle_parse(body: bytes):
    rules = polar_rules.PARSE
    if rules["byte_order_mark"] == "reject" and body.startswith(b"\xef\xbb\xbf"):
        raise Rejected
    try:
        text = body.decode(rules["encoding"])  # strict: UTF-16 and encoded surrogates fail here
    except UnicodeDecodeError:
        raise Rejected from None
    low, high = rules["integer_range"]

    def number(literal: str):
        value = float(literal)
        if math.isinf(value):
            raise Rejected
        return value

    def integer(literal: str):
        value = int(literal)
        return value if low <= value <= high else float(literal)

    try:
        value = json.loads(text, parse_constant=_reject, parse_float=number, parse_int=integer)
    except (ValueError, RecursionError):  # control characters in strings (strict mode); nesting too deep
        raise Rejected from None

    def walk(node, depth):
        if depth > rules["max_depth"]:
            raise Rejected
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise Rejected from None  # a lone surrogate escape
        elif isinstance(node, list):
            for item in node:
                walk(item, depth + 1)
        elif isinstance(node, dict):
            for key, item in node.items():
                walk(key, depth)
                walk(item, depth + 1)

    walk(value, 1)
    return value


def coerce(name: str, value):
    """The table's named coercions; None when the value is refused."""
    try:
        if name == "int()":
            return int(value)
        if name == "float()":
            return float(value)
    except (TypeError, ValueError):
        return None
    # lax_int
    if isinstance(value, bool) or (isinstance(value, int)):
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value == int(value) and abs(value) < 2**63 else None
    if isinstance(value, str):
        text = value.strip(" \t\n\r\f\v")
        return int(text.split(".")[0].replace("_", "")) if _LAX_STR.fullmatch(text) else None
    return None


def all_or_nothing(items, token_id_of, logprob_of, rule):
    ids, lps = [], []
    for item in items:
        tid, lp = token_id_of(item), logprob_of(item)
        if tid is None or lp is None:
            return None
        tid, lp = coerce(rule["token_id"], tid), coerce(rule["logprob"], lp)
        if tid is None or lp is None:
            return None
        ids.append(tid)
        lps.append(lp)
    return ids, lps


def oracle_trainable(body: bytes) -> tuple[bool, int]:
    """(parsed, trainable tokens) as the table describes Polar (no tokenizer, no max_tokens)."""
    try:
        response = oracle_parse(body)
    except Rejected:
        return False, 0
    if not isinstance(response, dict):
        return True, 0
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    # prompt
    prompt = None
    for path in polar_rules.PROMPT_IDS["sources"]:
        holder, key = (choice, path.split(".", 1)[1]) if path.startswith("choices[0].") else (response, path)
        prompt = prompt or holder.get(key)
    if not isinstance(prompt, list) or not prompt:
        return True, 0
    if any(coerce(polar_rules.PROMPT_IDS["element"], v) is None for v in prompt):
        return True, 0
    meta_rule, ids_rule, content_rule, _ = polar_rules.RESPONSE_SOURCES
    meta = choice.get("meta_info")
    entries = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None

    def meta_id(item):
        if isinstance(item, (list, tuple)):
            return item[1] if len(item) >= 2 else None
        return item.get("token_id") if isinstance(item, dict) else None

    def meta_lp(item):
        if isinstance(item, (list, tuple)):
            return item[0] if len(item) >= 2 else None
        return item.get("logprob", item.get("token_logprob")) if isinstance(item, dict) else None

    pair = all_or_nothing(entries, meta_id, meta_lp, meta_rule) if isinstance(entries, list) and entries else None
    if pair is None:
        raw_ids = choice["token_ids"] if "token_ids" in choice else response.get(ids_rule["fallback_path"])
        stamped, own_ids = content, choice.get(ids_rule["stamped_from"])
        if isinstance(own_ids, list) and isinstance(content, list) and len(content) == len(own_ids):
            stamped = [
                dict({"token_id": tid}, **item) if isinstance(item, dict) else item
                for item, tid in zip(content, own_ids, strict=False)
            ]
        candidate = None
        if isinstance(stamped, list) and stamped and all(isinstance(i, dict) for i in stamped):
            candidate = all_or_nothing(stamped, lambda i: i.get("token_id"), lambda i: i.get("logprob"), content_rule)
        ids = None
        if isinstance(raw_ids, list):
            coerced = [coerce(ids_rule["token_id"], v) for v in raw_ids]
            ids = None if None in coerced else coerced
        if ids is not None:
            pair = (ids, candidate[1] if candidate is not None and candidate[0] == ids else None)
        else:
            pair = candidate
    if pair is None or not pair[0] or not pair[1]:
        return True, 0
    if polar_rules.DELIVER["serializer"] == "json.dumps(allow_nan=False)":  # step 7: the result must serialize
        try:
            json.dumps(pair[1], allow_nan=False)
        except ValueError:
            return True, 0
    return True, len(pair[0])


# --- generated answers ---------------------------------------------------------------------------------------
# Hypothesis draws one byte string per answer and the builder below reads it as a recipe (a single draw keeps
# generation cheap enough for thousands of answers; shrinking still works byte by byte).

ODD_IDS = [
    True,
    False,
    1.0,
    2.5,
    -3.0,
    1e19,
    9.3e18,
    -9.3e18,
    None,
    "5",
    " 7 ",
    "+3",
    "1_0",
    "5.0",
    "5.5",
    "x",
    "",
    "05",
    "-0",
    "1e3",
    "NaN",
    2**63,
    2**64 - 1,
    2**64,
    2**64 + 1,
    -(2**63) - 1,
    2**70,
    -(2**70),
    [],
    {},
]
LOGPROBS = [-0.5, -3.25, 0.0, -0.0, 1e-300, 0.75, None, True, "-0.5", "NaN", "inf", "x", -1e-9, -20.0]
ENCODINGS = ["json"] * 24 + ["nan", "infinity", "1e999", "bom", "utf16", "surrogate", "list", "control"]


class Recipe:
    def __init__(self, data: bytes):
        self.data, self.at = data or b"\0", 0

    def byte(self) -> int:
        value = self.data[self.at % len(self.data)]
        self.at += 1
        return value

    def pick(self, options):
        return options[self.byte() % len(options)]

    def token_id(self):
        b = self.byte()
        return b * 600 if b < 160 else self.pick(ODD_IDS)

    def id_list(self):
        kind = self.byte() % 7
        if kind <= 1:
            return [self.byte() * 500 for _ in range(1 + self.byte() % 5)]
        if kind == 2:
            return [self.token_id() for _ in range(self.byte() % 4)]
        return [None, "12", {}, []][kind - 3]

    def meta_item(self):
        kind = self.byte() % 7
        if kind <= 2:
            item = [self.pick(LOGPROBS), self.token_id(), self.pick([None, "a", " b"])]
            return item[:2] if kind == 1 else item
        if kind == 3:
            return [self.pick(LOGPROBS)]
        if kind == 4:
            return {"token_id": self.token_id(), "logprob": self.pick(LOGPROBS)}
        if kind == 5:
            return {"token_id": self.token_id(), "token_logprob": self.pick(LOGPROBS)}
        return "x"

    def content_item(self):
        kind = self.byte() % 4
        if kind == 3:
            return 3
        item = {"token": "a", "logprob": self.pick(LOGPROBS)}
        if kind == 2:
            item["token_id"] = self.token_id()
        return item


def build_answer(data: bytes) -> bytes:
    r = Recipe(data)
    length = 1 + r.byte() % 4
    choice: dict = {}
    for key, odds in (("prompt_token_ids", 4), ("input_token_ids", 1), ("token_ids", 1)):
        if r.byte() % 5 < odds:
            choice[key] = r.id_list()
    meta = r.byte() % 6
    if meta in (0, 5):
        choice["meta_info"] = {"output_token_logprobs": [[-0.5 * (i + 1), 100 + i, "t"] for i in range(length)]}
    elif meta == 1:
        choice["meta_info"] = {"output_token_logprobs": [r.meta_item() for _ in range(r.byte() % 5)]}
    elif meta == 2:
        choice["meta_info"] = r.pick([None, {}, {"output_token_logprobs": None}])
    logprobs = r.byte() % 4
    if logprobs == 0:
        choice["logprobs"] = {"content": [r.content_item() for _ in range(r.byte() % 5)]}
    elif logprobs == 1:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.1} for _ in range(length)]}
    elif logprobs == 2:
        choice["logprobs"] = None
    body: dict = {"choices": [choice] * (1 + r.byte() % 2)}
    for key in ("prompt_token_ids", "token_ids"):
        if r.byte() % 4 == 0:
            body[key] = r.id_list()
    if r.byte() % 2:
        body["usage"] = {"prompt_tokens": r.byte() % 7, "completion_tokens": r.byte() % 10}
    encoding = r.pick(ENCODINGS)
    text = json.dumps(body)
    literal = {
        "nan": "NaN",
        "infinity": "-Infinity",
        "1e999": "1e999",
        "surrogate": '"\\ud800"',
        "control": '"a\x01b"',
    }.get(encoding)
    if literal is not None:
        text = text.replace("{", '{"x": ' + literal + ", ", 1)
    elif encoding == "list":
        text = f"[{text}]"
    raw = text.encode("utf-16") if encoding == "utf16" else text.encode()
    return b"\xef\xbb\xbf" + raw if encoding == "bom" else raw


def answers():
    return st.binary(min_size=24, max_size=64).map(build_answer)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers())
def test_model_agrees_with_the_rule_table_on_generated_answers(body):
    parsed, expected = oracle_trainable(body)
    verdict = polar_model.decide(body)
    assert (verdict.verdict != UNPARSEABLE) == parsed
    assert verdict.trainable_tokens == expected, (body, verdict.stage, verdict.reason)


def test_the_oracle_parses_exactly_like_orjson():
    """The table's parse rules are checked against the real parser on every literal class."""
    cases = [
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e999}',
        b'{"a": -1e999}',
        b"\xef\xbb\xbf{}",
        '{"a": 1}'.encode("utf-16"),
        b'{"a": "\\ud800"}',
        b'{"a": "\x01"}',
        b'{"a": 18446744073709551616}',
        b'{"a": -9223372036854775809}',
        b'{"a": 18446744073709551615}',
        b'{"a": 1e-400}',
        b'{"a":1}{',
        b"",
        b"[" * 1025 + b"]" * 1025,
        b'{"a": 1, "a": 2}',
    ]
    for body in cases:
        try:
            expected = orjson.loads(body)
        except orjson.JSONDecodeError:
            expected = Rejected
        try:
            got = oracle_parse(body)
        except Rejected:
            got = Rejected
        assert got == expected, body


# --- the model's steps on named shapes ---------------------------------------------------------------------


def sglang(prompt=(1, 2, 3), output=((-0.5, 10, "a"), (-0.25, 11, "b")), **choice_extra):
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ab"},
        "prompt_token_ids": list(prompt),
        "logprobs": {"content": [{"token": t, "logprob": lp} for lp, _, t in output]},
        "meta_info": {"output_token_logprobs": [list(e) for e in output]},
        **choice_extra,
    }
    return {"choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output)}}


def test_normalize_does_not_mutate_and_mirrors_sglang_canonicalization():
    body = sglang()
    before = copy.deepcopy(body)
    normalized = polar_model.normalize(body)
    assert body == before
    choice = normalized["choices"][0]
    assert "meta_info" not in choice and choice["token_ids"] == [10, 11] and choice["input_token_ids"] == [1, 2, 3]
    assert [e["token_id"] for e in choice["logprobs"]["content"]] == [10, 11]


@pytest.mark.parametrize(
    "entry",
    [[-0.5, math.inf, "a"], [-0.5, -math.inf, "a"], [10**400, 10, "a"], {"token_id": math.inf, "logprob": -0.5}],
)
def test_normalize_raises_where_polar_does_and_the_guarded_reading_never_does(entry):
    """engine.py catches TypeError/ValueError only: int(inf) and float(10**400) raise OverflowError out of Polar's
    normalize_response; the guarded reading counts the entry as unconvertible (all-or-nothing: no token_ids)."""
    body = sglang()
    body["choices"][0]["meta_info"]["output_token_logprobs"].append(entry)
    with pytest.raises(OverflowError):
        polar_model.normalize(body)
    choice = polar_model.normalize_guarded(body)["choices"][0]
    assert "meta_info" not in choice and "token_ids" not in choice and choice["input_token_ids"] == [1, 2, 3]


def test_the_guarded_reading_equals_polars_where_polar_does_not_raise():
    body = sglang()
    assert polar_model.normalize_guarded(body) == polar_model.normalize(body)
    body["choices"][0]["meta_info"]["output_token_logprobs"].append([None, 12, "c"])  # TypeError: Polar's own return
    assert polar_model.normalize_guarded(body) == polar_model.normalize(body)
    assert "token_ids" not in polar_model.normalize(body)["choices"][0]
    assert [polar_model.normalize_guarded(v) for v in ([], "x", 1, None)] == [None] * 4  # Polar raises on these


def test_prompt_alone_over_max_tokens_drops_the_trace_and_long_responses_are_clipped():
    body = json.dumps(sglang()).encode()
    assert polar_model.decide(body, max_tokens=3).trainable_tokens == 0
    assert polar_model.decide(body, max_tokens=4).trainable_tokens == 1


def test_recorded_polar_facts_are_acted_on():
    """`make verify-offline` checks configs/upstream/polar-facts.json against the model and the gate."""
    from polarstack.offline import verify as verify_offline

    check = verify_offline.check_polar_facts()
    assert check.ok, check.problems


def test_polar_facts_check_fails_on_the_bare_counter_key(monkeypatch):
    from polarstack.offline import verify as verify_offline
    from polarstack.train import gate

    monkeypatch.setattr(gate, "DELTA_METRIC", "polar/dropped_zero_trainable_groups")
    check = verify_offline.check_polar_facts()
    assert not check.ok and "Polar exports" in check.problems[0]


def test_a_nan_logprob_string_is_lost_at_polars_json_delivery():
    """Issue 18 point 8: the fuzzer's minimal answer. float("nan") parses, the trace is built, but Polar's gateway
    delivers the result with json.dumps(allow_nan=False) (node.py _push_result), so nothing is trained."""
    body = b'{"choices": [{"prompt_token_ids": [11888], "meta_info": {"output_token_logprobs": [["nan", 1000]]}}]}'
    verdict = polar_model.decide(body)
    assert verdict.verdict == NOT_TRAINABLE and verdict.trainable_tokens == 0
    assert verdict.stage == "deliver" and "Out of range float values are not JSON compliant" in verdict.reason
    assert oracle_trainable(body) == (True, 0)
    finite = body.replace(b'"nan"', b'"-0.5"')
    assert polar_model.decide(finite).trainable_tokens == 1 == oracle_trainable(finite)[1]


# --- real-engine answers (issue 21): the pinned sglang on the CPU, recorded by scripts/tools/record_real_answers.py
REAL_ANSWERS = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "real-sglang-answers.json").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("entry", REAL_ANSWERS["answers"], ids=lambda e: e["name"])
def test_model_agrees_with_the_rule_table_on_real_sglang_answers(entry):
    body = base64.b64decode(entry["body_b64"])
    parsed, expected = oracle_trainable(body)
    verdict = polar_model.decide(body, entry["request"])
    assert parsed and verdict.verdict != UNPARSEABLE
    assert verdict.trainable_tokens == expected, (entry["name"], verdict.stage, verdict.reason)
    # with Polar's two fields the real engine's answer is trainable; without them it is not (issue #52's symptom)
    with_fields = all(entry["request"].get(flag) is True for flag in ("return_prompt_token_ids", "return_meta_info"))
    assert (verdict.trainable_tokens > 0) == with_fields, entry["name"]


def _described(request: dict) -> str:
    """A real answer's request in a few words, as docs/polar-verdict.md's table names it."""
    words = ["Polar's two fields" if contract_flags_set(request) else "without Polar's fields"]
    if len(request.get("messages", [])) > 1:
        words.append(f"{len(request['messages'])} messages")
    if request.get("n", 1) > 1:
        words.append(f"n={request['n']}")
    if request.get("top_logprobs"):
        words.append(f"top_logprobs={request['top_logprobs']}")
    if request.get("tools"):
        words.append("a tool schema, scripted call")
    return ", ".join(words)


def contract_flags_set(request: dict) -> bool:
    return all(request.get(flag) is True for flag in ("return_prompt_token_ids", "return_meta_info"))


def real_answer_rows() -> list[str]:
    rows = []
    for entry in REAL_ANSWERS["answers"]:
        verdict = polar_model.decide(base64.b64decode(entry["body_b64"]), entry["request"])
        where = f"{verdict.stage}: {verdict.reason}" if verdict.trainable_tokens == 0 else ""
        found = ", ".join(f"`{w.code}`" for w in verdict.warnings)
        rows.append(
            f"| `{entry['name']}` | {_described(entry['request'])} | {verdict.verdict} | {verdict.trainable_tokens} "
            f"| {found} | {where} |"
        )
    return rows


def test_the_verdict_doc_lists_every_real_answer_with_the_models_verdict():
    """docs/polar-verdict.md's real-engine table is the fixture's, judged by the model: a re-recorded fixture or a
    changed model that the doc does not follow fails here (the expected rows are in the message)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "polar-verdict.md").read_text(encoding="utf-8")
    missing = [row for row in real_answer_rows() if row not in doc]
    assert not missing, "\n".join(missing)
    table = doc[doc.index("| answer | request | Polar's verdict") :].split("\n\n", 1)[0].splitlines()[2:]
    assert table == real_answer_rows(), "the doc's table has rows the fixture does not"
    assert f"sglang {REAL_ANSWERS['sglang_version']}" in doc
