"""Pins the smoke's tool-call check (issue 10 point 4) as one of the smoke's Polar-judged exchanges: the tool
request has Polar's request shape (stream false, logprobs, return_prompt_token_ids, return_meta_info) plus one tool
schema, temperature 0 and tool_choice "auto" (what Polar's Anthropic transform sends for Claude Code); it goes to
every distinct target; its answer is parsed with orjson and judged by polar_model.decide like the others, recorded
as a "tools" exchange whose trainable tokens count; and each outcome has its own sentence and exit code: parsed
tool_calls -> 0, raw <tool_call> text -> 12 naming --tool-call-parser, cut at max_tokens -> 2 naming the setting
(not the parser), prose without a call -> 12 saying the model did not call the tool, token fields missing on the
tool answer -> the token verdict's code (3/4/7). Answers are served by in-process transports (no network)."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack.checks import budget, smoke, tool_exchange
from polarstack.errors import ExitCode

pytestmark = pytest.mark.unit
URL = "http://engine.invalid"
CALL = {
    "id": "call_0",
    "index": 0,
    "type": "function",
    "function": {"name": "write_file", "arguments": '{"path": "solution.py", "content": "x"}'},
}
RAW_CALL = '<tool_call>\n{"name": "write_file", "arguments": {"path": "solution.py"}}\n</tool_call>'


def answer(message: dict | None = None, finish: str = "stop", tokens: bool = True) -> dict:
    """An sglang chat completion; with tokens=False the two fields Polar asks for are absent (a dropping path)."""
    output = [[-0.5, 10, "a"], [-0.25, 11, "b"], [-0.1, 12, "c"]]
    choice = {
        "index": 0,
        "message": message or {"role": "assistant", "content": "abc"},
        "finish_reason": finish,
        "logprobs": {"content": [{"token": t, "logprob": lp, "top_logprobs": []} for lp, _, t in output]},
    }
    if tokens:
        choice.update(prompt_token_ids=[1, 2, 3, 4], meta_info={"output_token_logprobs": output})
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }


PARSED = answer({"role": "assistant", "content": None, "tool_calls": [CALL]}, "tool_calls")


def serve(monkeypatch, tool_answer: dict | bytes, workers: list[str] | None = None) -> list[tuple[str, dict]]:
    """Every chat answer is Polar-complete except the tool request's, which is `tool_answer`. With `workers`, the
    base URL is a router listing them (Polar's worker bypass). Returns the log of (url, body) of chat requests."""
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        if request.url.path == "/workers":
            if workers is None:
                return httpx.Response(404, json={"error": "no worker list"})
            return httpx.Response(200, json={"workers": [{"url": w, "worker_type": "regular"} for w in workers]})
        body = json.loads(request.content)
        seen.append((str(request.url), body))
        if body.get("tools"):
            content = tool_answer if isinstance(tool_answer, bytes) else json.dumps(tool_answer).encode()
            return httpx.Response(200, content=content, headers={"content-type": "application/json"})
        return httpx.Response(200, json=answer())

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))
    return seen


def run(**options) -> smoke.SmokeReport:
    return smoke.run_smoke(URL, requests=1, turns=0, **options)


def tool_entries(report) -> list[dict]:
    return [e for e in report.exchanges if e["kind"] == "tools"]


def test_parsed_tool_calls_pass_and_the_tool_exchange_counts(monkeypatch):
    serve(monkeypatch, PARSED)
    report = run()
    assert report.ok, report.message
    (entry,) = tool_entries(report)
    assert entry["tool_outcome"] == tool_exchange.PARSED and entry["tool_calls"] == 1
    assert entry["polar"]["polar_trainable_tokens"] == 3 and entry["polar"]["polar_verdict"] == "trainable"
    assert report.trainable_tokens == 3 + 3  # the single request's 3 + the tool answer's 3
    data = report.as_dict()
    assert [r["kind"] for r in data["requests"]] == ["single", "tools"]
    assert data["tool_calls"]["tool_calls"] == 1 and "parsed tool_calls from 1 target" in report.message


def test_the_tool_request_has_polars_shape_and_asks_for_the_tool(monkeypatch):
    seen = serve(monkeypatch, PARSED)
    assert run().ok
    (body,) = [b for _, b in seen if b.get("tools")]
    assert body["stream"] is False and body["logprobs"] is True
    assert body["return_prompt_token_ids"] is True and body["return_meta_info"] is True
    assert body["temperature"] == 0 and body["tool_choice"] == "auto"
    assert body["max_tokens"] == budget.harness_request_shape()[1] >= 256
    assert body["tools"] == [tool_exchange.SMOKE_TOOL] and "write_file tool" in body["messages"][-1]["content"]


def test_raw_tool_call_text_fails_with_12_naming_the_parser_flag(monkeypatch):
    serve(monkeypatch, answer({"role": "assistant", "content": RAW_CALL}))
    report = run()
    assert report.code == ExitCode.TOOL_CALLS
    assert "raw <tool_call> text" in report.message and "--tool-call-parser" in report.message
    assert tool_entries(report)[0]["tool_outcome"] == tool_exchange.RAW_TEXT


def test_an_answer_cut_at_max_tokens_names_the_setting_not_the_parser(monkeypatch):
    cut = answer({"role": "assistant", "content": '<tool_call>\n{"name": "write_file", "argu'}, "length")
    serve(monkeypatch, cut)
    report = run()
    assert report.code == ExitCode.USAGE
    assert (
        f"cut at max_tokens {budget.harness_request_shape()[1]}" in report.message
        and tool_exchange.MAX_TOKENS_ENV in report.message
    )
    assert "--tool-call-parser" not in report.message
    assert tool_entries(report)[0]["tool_outcome"] == tool_exchange.CUT


def test_the_max_tokens_setting_reaches_the_request(monkeypatch):
    seen = serve(monkeypatch, PARSED)
    monkeypatch.setenv(tool_exchange.MAX_TOKENS_ENV, "2048")
    assert run().ok
    assert [b["max_tokens"] for _, b in seen if b.get("tools")] == [2048]
    monkeypatch.setenv(tool_exchange.MAX_TOKENS_ENV, "lots")
    assert run().code == ExitCode.USAGE


def test_prose_without_a_call_fails_with_12_saying_the_model_did_not_call_the_tool(monkeypatch):
    serve(monkeypatch, answer({"role": "assistant", "content": "Here is the code: def add(a, b): return a + b"}))
    report = run()
    assert report.code == ExitCode.TOOL_CALLS
    assert "answered the tool request in prose without calling the tool" in report.message
    assert "may be the model" in report.message and "raw <tool_call>" not in report.message
    assert tool_entries(report)[0]["tool_outcome"] == tool_exchange.PROSE


def test_token_fields_missing_only_on_the_tool_answer_is_tokens_missing(monkeypatch):
    serve(
        monkeypatch,
        {
            **PARSED,
            "choices": [{k: v for k, v in PARSED["choices"][0].items() if k not in ("prompt_token_ids", "meta_info")}],
        },
    )
    report = run()
    assert report.code == ExitCode.TOKENS_MISSING, report.message
    assert report.fields_missing == ["return_prompt_token_ids", "return_meta_info"]
    assert tool_entries(report)[0]["polar"]["polar_trainable_tokens"] == 0


def test_tool_answer_with_fields_but_nothing_trainable_is_invariant(monkeypatch):
    empty = json.loads(json.dumps(PARSED))
    empty["choices"][0]["meta_info"]["output_token_logprobs"] = [[None, 10, "a"]]  # a null invalidates the list
    empty["choices"][0]["logprobs"]["content"] = []
    serve(monkeypatch, empty)
    report = run()
    assert report.code == ExitCode.INVARIANT, report.message
    assert tool_entries(report)[0]["polar"]["polar_trainable_tokens"] == 0


def test_tool_answer_polars_orjson_rejects_is_malformed(monkeypatch):
    serve(monkeypatch, json.dumps(PARSED).replace("-0.5", "NaN", 1).encode())
    report = run()
    assert report.code == ExitCode.MALFORMED and "orjson" in report.message


def test_every_target_of_polars_worker_bypass_gets_a_tool_request(monkeypatch):
    workers = ["http://w1.invalid", "http://w2.invalid", "http://w3.invalid"]
    seen = serve(monkeypatch, PARSED, workers=workers)
    report = smoke.run_smoke(URL, requests=2, turns=0, route="polar")
    assert report.ok, report.message
    assert sorted(u for u, b in seen if b.get("tools")) == [f"{w}/v1/chat/completions" for w in workers]
    assert len(tool_entries(report)) == 3 and report.tool_check["tool_calls"] == 3


def test_one_target_without_the_parser_fails_the_smoke(monkeypatch):
    """Only the second worker answers with raw text: checking targets[0] alone would pass."""
    workers = ["http://w1.invalid", "http://w2.invalid"]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/workers":
            return httpx.Response(200, json={"workers": [{"url": w, "worker_type": "regular"} for w in workers]})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if json.loads(request.content).get("tools"):
            seen.append(request.url.host)
            if request.url.host == "w2.invalid":
                return httpx.Response(200, json=answer({"role": "assistant", "content": RAW_CALL}))
            return httpx.Response(200, json=PARSED)
        return httpx.Response(200, json=answer())

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))
    report = smoke.run_smoke(URL, requests=2, turns=0, route="polar")
    assert report.code == ExitCode.TOOL_CALLS and "w2.invalid" in report.message
    assert sorted(seen) == ["w1.invalid", "w2.invalid"]


@pytest.mark.parametrize(
    "content,finish,outcome",
    [
        (None, "tool_calls", "parsed"),
        (RAW_CALL, "stop", "raw_tool_call_text"),
        (RAW_CALL[:30], "length", "cut_at_max_tokens"),
        ("I would write the file.", "stop", "prose_without_call"),
        ("", "stop", "prose_without_call"),
    ],
)
def test_classify(content, finish, outcome):
    message = {"role": "assistant", "content": content}
    if outcome == "parsed":
        message["tool_calls"] = [CALL]
    assert tool_exchange.classify(answer(message, finish))[0] == outcome


def test_verify_offline_checks_the_recorded_harness_tool_choice(monkeypatch):
    """configs/upstream/polar-tool-request.json: Polar's transform sends tool_choice "auto" for Claude Code."""
    assert tool_exchange.recorded_fact_problems() == []
    monkeypatch.setattr(tool_exchange, "TOOL_CHOICE", "required")
    problems = tool_exchange.recorded_fact_problems()
    assert len(problems) == 1 and "tool_choice 'required'" in problems[0] and "'auto'" in problems[0]
    monkeypatch.setattr(tool_exchange, "TOOL_CHOICE", "auto")
    monkeypatch.setattr(smoke.contract, "prepare_request", lambda body: dict(body))  # built without Polar's flags
    assert "lacks Polar's request shape" in tool_exchange.recorded_fact_problems()[0]


SKIP = "the real engine's random model calls a tool only when its answer is scripted"
SCRIPT = {"custom_logit_processor": "processor", "custom_params": {"token_ids": [1, 2]}}
CUT_ANSWER = answer({"role": "assistant", "content": "abc"}, "length")


def test_an_unscripted_tool_request_is_capped_and_its_outcome_not_judged(monkeypatch):
    """The local real engine behind a field-dropping router (stack.real_sglang.script_unreachable): the script
    would be dropped, so the unscripted random model would run the tool request to 4096 tokens. The request still
    goes (what the router does with it is reported), capped, and its outcome (here cut at max_tokens, which
    would otherwise fail with USAGE) is not judged; the summary and the sentence say why."""
    seen = serve(monkeypatch, CUT_ANSWER)
    report = run(tool_fields=SCRIPT, tool_unscripted=SKIP)
    assert report.ok, report.message
    (body,) = [b for _, b in seen if b.get("tools")]
    assert body["max_tokens"] == tool_exchange.UNSCRIPTED_MAX_TOKENS
    (entry,) = tool_entries(report)
    assert entry["tool_outcome"] == tool_exchange.CUT
    assert report.tool_check["not_judged"] == SKIP and report.as_dict()["tool_calls"]["not_judged"] == SKIP
    assert report.message.endswith(f"; tool-call outcome not judged: {SKIP}")
    # the same answer without the reason is the smoke's own budget problem (USAGE)
    serve(monkeypatch, CUT_ANSWER)
    assert run(tool_fields=SCRIPT).code == ExitCode.USAGE


def test_the_script_goes_along_when_polar_bypasses_the_router(monkeypatch):
    """Polar's worker bypass sends straight to the engines: the script reaches them, so the tool request carries
    it at its full max_tokens and the outcome is judged."""
    workers = ["http://w1.invalid", "http://w2.invalid"]
    seen = serve(monkeypatch, PARSED, workers=workers)
    report = smoke.run_smoke(URL, requests=2, turns=0, route="polar", tool_fields=SCRIPT, tool_unscripted=SKIP)
    assert report.ok, report.message
    tool_bodies = [(u, b) for u, b in seen if b.get("tools")]
    assert sorted(u for u, _ in tool_bodies) == [f"{w}/v1/chat/completions" for w in workers]
    assert all(b["custom_logit_processor"] == "processor" for _, b in tool_bodies)
    assert all(b["max_tokens"] > tool_exchange.UNSCRIPTED_MAX_TOKENS for _, b in tool_bodies)
    assert "not_judged" not in report.tool_check and "parsed tool_calls from 2 target(s)" in report.message
