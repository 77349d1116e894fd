"""Pins the smoke's tool-call check (issue 10 point 4, issue 32 point 6) as one of the smoke's Polar-judged
exchanges: the tool requests have Polar's request shape (stream false, logprobs, return_prompt_token_ids,
return_meta_info) plus the agent's 12 tools, temperature 0 and tool_choice "auto" (what Polar's Anthropic transform
sends for Claude Code); an unpadded and an agent-length one go to every distinct target; each answer is parsed with
orjson and judged by polarstack.polar.model.decide like the others, recorded as a "tools" exchange whose trainable tokens
count; and each outcome of the unpadded one has its own sentence and exit code: parsed tool_calls -> 0, raw
<tool_call> text -> 12 naming --tool-call-parser, cut at max_tokens -> 2 naming the setting (not the parser), prose
without a call -> 12 saying the model did not call the tool, token fields missing on the tool answer -> the token
verdict's code (3/4/7); prose on the agent-length one only is a warning. Answers are served by in-process
transports (no network)."""

from __future__ import annotations

import json

import httpx
import pytest

from polarstack.checks import budget, smoke, tool_exchange
from polarstack.checks.exchange import SmokeReport
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.engine import agent_turn
from polarstack.errors import ExitCode, StackError

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


def padded(body: dict) -> bool:
    return any(m["role"] == "system" for m in body["messages"])


def serve(
    monkeypatch, tool_answer: dict | bytes, workers: list[str] | None = None, padded_answer: dict | None = None
) -> list[tuple[str, dict]]:
    """Every chat answer is Polar-complete except the tool requests', which are `tool_answer` (the agent-length one:
    `padded_answer` when given). With `workers`, the base URL is a router listing them (Polar's worker bypass).
    Returns the log of (url, body) of chat requests."""
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
            reply = padded_answer if padded_answer is not None and padded(body) else tool_answer
            content = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
            return httpx.Response(200, content=content, headers={"content-type": "application/json"})
        return httpx.Response(200, json=answer())

    monkeypatch.setattr(smoke, "client", lambda timeout: httpx.Client(transport=httpx.MockTransport(handler)))
    return seen


def run(knobs: dict[str, str] | None = None, **target) -> SmokeReport:
    """One plain request and the tool requests to URL; `target`: SmokeTarget's fields (the real engine's script);
    `knobs`: the smoke's knobs by their variables, as its caller read them (the CLI: its environment)."""
    options = SmokeOptions(requests=1, turns=0, knobs=tool_exchange.knobs_from(knobs or {}))
    return smoke.run_smoke(SmokeTarget(URL, **target), options)


def tool_entries(report) -> list[dict]:
    return [e for e in report.exchanges if e["kind"] == "tools"]


def test_parsed_tool_calls_pass_and_the_tool_exchange_counts(monkeypatch):
    serve(monkeypatch, PARSED)
    report = run()
    assert report.ok, report.message
    short, long = tool_entries(report)
    assert [short["padded"], long["padded"]] == [False, True]
    for entry in (short, long):
        assert entry["tool_outcome"] == tool_exchange.PARSED and entry["tool_calls"] == 1
        assert entry["polar"]["polar_trainable_tokens"] == 3 and entry["polar"]["polar_verdict"] == "trainable"
    assert report.trainable_tokens == 3 + 3 + 3  # the single request's 3 + each tool answer's 3
    data = report.as_dict()
    assert [r["kind"] for r in data["requests"]] == ["single", "tools", "tools"]
    assert data["tool_calls"]["tool_calls"] == 2 and "parsed tool_calls from 1 target" in report.message


def test_the_tool_request_has_polars_shape_and_asks_for_the_tool(monkeypatch):
    seen = serve(monkeypatch, PARSED)
    assert run().ok
    short, long = [b for _, b in seen if b.get("tools")]
    for body in (short, long):
        assert body["stream"] is False and body["logprobs"] is True
        assert body["return_prompt_token_ids"] is True and body["return_meta_info"] is True
        assert body["temperature"] == 0 and body["tool_choice"] == "auto"
        assert body["max_tokens"] == budget.harness_request_shape()[1] >= 256
        names = [t["function"]["name"] for t in body["tools"]]
        assert names == budget.harness_record()["agent_turn"]["tool_names"] and len(names) == 12
        assert "Write tool" in body["messages"][-1]["content"]
    assert not padded(short) and short["messages"] == [{"role": "user", "content": tool_exchange.TOOL_PROMPT}]
    assert padded(long) and long["messages"][-1]["content"].endswith(tool_exchange.TOOL_PROMPT)


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
    assert run({tool_exchange.MAX_TOKENS_ENV: "2048"}).ok
    assert [b["max_tokens"] for _, b in seen if b.get("tools")] == [2048, 2048]
    assert run({tool_exchange.MAX_TOKENS_ENV: "lots"}).code == ExitCode.USAGE


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
    report = smoke.run_smoke(SmokeTarget(URL, route="polar"), SmokeOptions(requests=2, turns=0))
    assert report.ok, report.message
    assert sorted(u for u, b in seen if b.get("tools")) == sorted(2 * [f"{w}/v1/chat/completions" for w in workers])
    assert len(tool_entries(report)) == 6 and report.tool_check["tool_calls"] == 6


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
    report = smoke.run_smoke(SmokeTarget(URL, route="polar"), SmokeOptions(requests=2, turns=0))
    assert report.code == ExitCode.TOOL_CALLS and "w2.invalid" in report.message
    assert sorted(seen) == ["w1.invalid", "w1.invalid", "w2.invalid", "w2.invalid"]


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
    bodies = [b for _, b in seen if b.get("tools")]
    assert [b["max_tokens"] for b in bodies] == [tool_exchange.UNSCRIPTED_MAX_TOKENS] * 2
    assert all(e["tool_outcome"] == tool_exchange.CUT for e in tool_entries(report))
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
    report = smoke.run_smoke(
        SmokeTarget(URL, route="polar", tool_fields=SCRIPT, tool_unscripted=SKIP), SmokeOptions(requests=2, turns=0)
    )
    assert report.ok, report.message
    tool_bodies = [(u, b) for u, b in seen if b.get("tools")]
    assert sorted(u for u, _ in tool_bodies) == sorted(2 * [f"{w}/v1/chat/completions" for w in workers])
    assert all(b["custom_logit_processor"] == "processor" for _, b in tool_bodies)
    assert all(b["max_tokens"] > tool_exchange.UNSCRIPTED_MAX_TOKENS for _, b in tool_bodies)
    assert "not_judged" not in report.tool_check and "parsed tool_calls from 2 target(s)" in report.message


# --- issue 32 point 6: the agent's first turn, the warning/failure split, the deadline rule ---

PROSE_ANSWER = answer({"role": "assistant", "content": "I would write solution.py with an add function."})


def test_the_tool_requests_carry_the_harness_tools_of_their_recorded_kind_and_length():
    """12 tools with the recorded names, order and parameter names; each of a known kind; the padded request's
    system prompt and whole prompt (counted with the Qwen tokenizer, record `smoke_request`) within the tolerance
    of the recorded harness; the unpadded one far shorter and without a system prompt."""
    record = budget.harness_record()
    turn = record["agent_turn"]
    assert agent_turn.shape_problems(record) == []
    short, long = tool_exchange.tool_request("m", padded=False), tool_exchange.tool_request("m", padded=True)
    for body in (short, long):
        tools = {t["function"]["name"]: t["function"] for t in body["tools"]}
        assert list(tools) == turn["tool_names"] and len(tools) == 12
        assert {agent_turn.KINDS[name] for name in tools} >= {"shell", "file_read", "file_write", "file_edit", "search"}
        write, bash, read, edit = tools["Write"], tools["Bash"], tools["Read"], tools["Edit"]
        assert write["parameters"]["required"] == ["file_path", "content"]
        assert {p["type"] for p in write["parameters"]["properties"].values()} == {"string"}
        assert bash["parameters"]["properties"]["command"]["type"] == "string"
        assert read["parameters"]["properties"]["offset"]["type"] == "integer"
        assert edit["parameters"]["required"] == ["file_path", "old_string", "new_string"]
        items = tools["ReportFindings"]["parameters"]["properties"]["findings"]["items"]
        assert items["type"] == "object" and "summary" in items["properties"]
    measured = record["smoke_request"]
    assert abs(measured["prompt_tokens"] - turn["harness_prompt_tokens"]) <= 0.1 * turn["harness_prompt_tokens"]
    assert abs(measured["system_tokens"] - turn["system"]["tokens"]) <= 0.1 * turn["system"]["tokens"]
    system = long["messages"][0]["content"]
    assert abs(agent_turn.estimate_tokens(system) - turn["system"]["tokens"]) <= 0.1 * turn["system"]["tokens"]
    assert agent_turn.request_tokens(short) < agent_turn.request_tokens(long) / 3


def test_shape_problems_name_a_request_that_is_not_the_recorded_one():
    record = budget.harness_record()
    stale = json.loads(json.dumps(record))
    stale["smoke_request"]["fingerprint"] = "0" * 64
    assert any(
        "rerun scripts/tools/measure_harness_prompt.py --smoke-request" in p for p in agent_turn.shape_problems(stale)
    )
    short = json.loads(json.dumps(record))
    short["smoke_request"]["prompt_tokens"] = int(record["agent_turn"]["harness_prompt_tokens"] * 0.8)
    assert any("whole prompt" in p and "apart" in p for p in agent_turn.shape_problems(short))
    unknown = json.loads(json.dumps(record))
    unknown["agent_turn"]["tool_names"].append("Teleport")
    unknown["agent_turn"]["tool_shapes"].append({"name": "Teleport", "parameters": {"type": "object"}})
    assert agent_turn.shape_problems(unknown) == [
        "recorded tools of no known kind: ['Teleport']; add them to agent_turn.KINDS with their kind"
    ]
    renamed = json.loads(json.dumps(record))
    renamed["agent_turn"]["tool_names"][0] = "Task"  # the names list no longer matches the shapes
    assert any("are not the recorded" in p for p in agent_turn.shape_problems(renamed))


def test_prose_on_the_padded_request_is_a_warning_when_the_unpadded_one_parsed(monkeypatch):
    serve(monkeypatch, PARSED, padded_answer=PROSE_ANSWER)
    report = run()
    assert report.ok and report.code == ExitCode.OK, report.message
    (warning,) = [w for w in report.warnings if "agent-length tool request" in w and "prose" in w]
    assert "in prose without calling a tool" in warning and "called the tool on the unpadded one" in warning
    assert "parsed tool_calls from 1 target" in report.message


def test_a_cut_padded_answer_is_a_warning_too(monkeypatch):
    serve(monkeypatch, PARSED, padded_answer=CUT_ANSWER)
    report = run()
    assert report.ok, report.message
    assert any("agent-length tool request" in w and "cut at max_tokens" in w for w in report.warnings)


def test_prose_on_both_requests_fails_with_one_sentence_naming_both(monkeypatch):
    serve(monkeypatch, PROSE_ANSWER)
    report = run()
    assert report.code == ExitCode.TOOL_CALLS
    assert "in prose without calling the tool and the agent-length one too" in report.message
    assert "Write" in report.message and report.message.count(".") >= 1 and "\n" not in report.message


def test_prose_on_the_unpadded_request_fails_even_when_the_padded_one_parsed(monkeypatch):
    serve(monkeypatch, PROSE_ANSWER, padded_answer=PARSED)
    report = run()
    assert report.code == ExitCode.TOOL_CALLS and "agent-length one too" not in report.message


def test_without_padding_only_the_unpadded_request_goes(monkeypatch):
    seen = serve(monkeypatch, PARSED)
    report = run({tool_exchange.PAD_ENV: "0"})
    assert report.ok, report.message
    bodies = [b for _, b in seen if b.get("tools")]
    assert len(bodies) == 1 and not padded(bodies[0]) and report.tool_check["prompt_padding_tokens"] == 0


def test_an_engine_counting_far_fewer_prompt_tokens_than_the_harness_is_a_warning(monkeypatch):
    serve(monkeypatch, PARSED)  # the served answers' usage says 4 prompt tokens
    report = run()
    assert report.ok
    assert any("counted 4 prompt tokens for the agent-length tool request" in w for w in report.warnings)


def test_the_deadline_follows_the_requests_token_count(monkeypatch):
    """max(floor, prompt tokens / min prefill rate + max_tokens / min decode rate), from defaults.yaml; the
    knob overrides it; the target's own need raises the floor; each tool request gets its own."""
    rule = tool_exchange.deadline_rule()
    assert rule == {
        "floor_seconds": 30.0,
        "min_prefill_tokens_per_second": 1000.0,
        "min_decode_tokens_per_second": 20.0,
    }
    assert tool_exchange.smoke_deadline(None, 40, 16) == 30.0  # a plain request: the floor
    assert tool_exchange.smoke_deadline(None, 11583, 4096) == round(11583 / 1000 + 4096 / 20, 1) == 216.4
    assert tool_exchange.smoke_deadline(60.0, 0, 16) == 60.0
    assert tool_exchange.smoke_deadline(60.0, 20000, 4096) == 224.8
    assert tool_exchange.smoke_deadline(None, 11583, 4096, knob="90") == 90.0

    timeouts: list[tuple[bool, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        if request.url.path == "/workers":
            return httpx.Response(404, json={})
        body = json.loads(request.content)
        if body.get("tools"):
            timeouts.append((padded(body), request.extensions["timeout"]["read"]))
            return httpx.Response(200, json=PARSED)
        timeouts.append((None, request.extensions["timeout"]["read"]))
        return httpx.Response(200, json=answer())

    monkeypatch.setattr(
        smoke, "client", lambda timeout: httpx.Client(timeout=timeout, transport=httpx.MockTransport(handler))
    )
    report = smoke.run_smoke(SmokeTarget(URL), SmokeOptions(requests=1, turns=0, timeout=30.0))
    assert report.ok, report.message
    short, long = (tool_exchange.tool_request("m", padded=p) for p in (False, True))
    expected = {
        p: tool_exchange.smoke_deadline(30.0, agent_turn.request_tokens(b), b["max_tokens"])
        for p, b in ((False, short), (True, long))
    }
    assert timeouts[0] == (None, 30.0)  # the plain request keeps the smoke's own deadline
    assert timeouts[1:] == [(False, expected[False]), (True, expected[True])]
    assert expected[True] > expected[False] > 100 and report.tool_check["deadline_s"]["padded"] == expected[True]


def test_a_bad_deadline_setting_is_usage_naming_it(monkeypatch):
    monkeypatch.setattr(tool_exchange, "load_yaml", lambda text: {"gate": {"smoke_deadline": {"floor_seconds": 0}}})
    with pytest.raises(StackError) as caught:
        tool_exchange.smoke_deadline()
    assert caught.value.code == ExitCode.USAGE and "gate.smoke_deadline.floor_seconds" in caught.value.message


def test_a_captured_agent_request_replaces_the_projects_prose_in_the_padded_request(monkeypatch, tmp_path):
    """The optional capture (measure_harness_prompt.py --save-request, never committed): the padded request carries
    its system text and tools as function tools, the smoke's task in place of the capture's prompt; the unpadded
    request stays the project's. A capture that cannot be read here is a warning, and the project's request goes."""
    capture = {
        "system": [{"type": "text", "text": "CLI system block one."}, {"type": "text", "text": "Block two."}],
        "tools": [
            {"name": "Write", "description": "CLI words.", "input_schema": {"type": "object", "properties": {}}},
            {"name": "Bash", "description": "More CLI words.", "input_schema": {"type": "object"}},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "<ctx/> " + agent_turn.CAPTURE_PROMPT}]}],
    }
    path = tmp_path / "agent-request.json"
    path.write_text(json.dumps(capture))
    seen = serve(monkeypatch, PARSED)
    report = run({agent_turn.CAPTURED_ENV: str(path)})
    assert report.ok, report.message
    short, long = [b for _, b in seen if b.get("tools")]
    assert long["messages"][0] == {"role": "system", "content": "CLI system block one.\nBlock two."}
    assert long["messages"][1]["content"] == "<ctx/> " + tool_exchange.TOOL_PROMPT
    assert [t["function"]["name"] for t in long["tools"]] == ["Write", "Bash"]
    assert long["tools"][0]["function"]["description"] == "CLI words."
    assert len(short["tools"]) == 12 and not padded(short)
    seen = serve(monkeypatch, PARSED)
    report = run({agent_turn.CAPTURED_ENV: str(tmp_path / "missing.json")})
    assert report.ok, report.message
    assert any(agent_turn.CAPTURED_ENV in w and "project's agent-length request instead" in w for w in report.warnings)
    long = [b for _, b in seen if b.get("tools")][1]
    assert len(long["tools"]) == 12 and long["messages"][0]["content"].startswith(agent_turn.PROSE[0])
