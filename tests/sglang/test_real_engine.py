"""The token contract, the routers, the total-token check and the tool parser against the real pinned sglang.

Issue #52 end to end with no stand-in: the smoke's exit code direct and behind every pinned router release and the
catalog's boundary releases, each expected from polarstack.routers.catalog (forwards_unknown_chat_fields); sglang's
own total-token refusal (tokenizer_manager.py, the sentence recorded in configs/upstream/real-sglang-cpu.json); the
real `--tool-call-parser` turning a scripted Qwen `<tool_call>` answer into message.tool_calls, and raw text without
the parser. The random model's tool answer is forced by a custom logit processor (polarstack.stack.real_sglang).
"""

import json
import re

import httpx
import pytest

from polarstack.checks import budget, tool_exchange
from polarstack.checks.smoke import run_smoke
from polarstack.checks.smoke_inputs import SmokeOptions, SmokeTarget
from polarstack.engine import agent_turn, tool_parser
from polarstack.errors import ExitCode
from polarstack.pins import pin, repo_root
from polarstack.polar import contract
from polarstack.polar.contract import POLAR_REQUEST_FLAGS
from polarstack.routers.catalog import RouterRelease
from polarstack.stack import real_sglang
from polarstack.stack.profiles import knob

MODEL = knob(None, "SERVED_MODEL_NAME")
TIMEOUT = 60.0  # per smoke request: the real engine on a loaded 2-core CPU (polarstack.stack.real_sglang.SMOKE_TIMEOUT)
# The profiles' pins, and the boundary releases around the fix
# (polarstack.routers.catalog.RouterRelease.forwards_unknown_chat_fields): sglang-router 0.1.4 forwards, 0.1.5
# drops; smg 1.4.1 drops, 1.5.0 forwards.
PINNED = [
    f"{pin(k + '_PACKAGE')}=={pin(k + '_VERSION')}" for k in ("ROUTER_PASSTHROUGH", "ROUTER_STOCK", "ROUTER_PATCHED")
]
BOUNDARY = ["sglang-router==0.1.5", "smg==1.4.1", "smg==1.5.0"]
# Measured (the same in front of the emulator, tests/integration/test_real_routers.py): sglang-router 0.1.5 refuses the
# smoke's tool request itself (HTTP 400 "Json deserialize error: data did not match any variant of untagged enum
# ToolChoice"); since issue 18 point 9 the smoke reports the most fundamental failure first (its chat requests lost
# both fields: exit 3) and names that refusal.
REFUSES_TOOL_REQUEST = {"sglang-router==0.1.5": "untagged enum ToolChoice"}
RECORD = json.loads((repo_root() / "configs" / "upstream" / "real-sglang-cpu.json").read_text())


def smoke(url: str, fields: dict | None, tool_unscripted: str | None = None, **options):
    target = SmokeTarget(url, route="base", tool_fields=fields, tool_unscripted=tool_unscripted)
    return run_smoke(target, SmokeOptions(timeout=TIMEOUT, **options))


def test_smoke_direct_passes_with_parsed_tool_calls(real_engine, scripted_tool_fields):
    report = smoke(real_engine.url, scripted_tool_fields)
    assert report.code == ExitCode.OK, report.message
    assert report.trainable_tokens > 0
    assert report.polar_verdict == "trainable"
    # the unpadded and the agent-length tool request (issue 32 point 6), both answered with the scripted Write call
    assert [t["outcome"] for t in report.tool_check["targets"]] == [tool_exchange.PARSED, tool_exchange.PARSED]
    assert [t["padded"] for t in report.tool_check["targets"]] == [False, True]
    assert all(t["finish_reason"] == "tool_calls" for t in report.tool_check["targets"])
    assert report.tool_check["targets"][1]["prompt_tokens"] > budget.harness_request_shape()[0]


@pytest.mark.parametrize("spec", PINNED + BOUNDARY)
def test_smoke_exit_code_behind_each_router_release(real_engine, scripted_tool_fields, router_factory, spec):
    """As the local runtime runs it (stack.local.up): the scripted tool answer, which a router without a catch-all
    drops; there the tool request is capped and its outcome not judged (the random model would run it to 4096
    tokens, 60 s behind 0.3.2 here), but what the router does with it is still reported."""
    release = RouterRelease.parse(spec)
    router = router_factory(spec, [real_engine.url], timeout=120.0)
    unscripted = real_sglang.script_unreachable(release)
    report = smoke(router.url, scripted_tool_fields, tool_unscripted=unscripted)
    if release.forwards_unknown_chat_fields:
        assert unscripted is None
        assert report.code == ExitCode.OK, report.message
        assert report.trainable_tokens > 0
        # the logit processor's fields reach the engine too, so the parser's answer comes back through the router,
        # for the unpadded and the agent-length tool request alike (issue 32 point 6)
        assert [t["outcome"] for t in report.tool_check["targets"]] == [tool_exchange.PARSED, tool_exchange.PARSED]
        assert [t["padded"] for t in report.tool_check["targets"]] == [False, True]
        return
    assert report.code == ExitCode.TOKENS_MISSING, report.message
    assert report.trainable_tokens == 0
    assert sorted(report.fields_missing) == sorted(POLAR_REQUEST_FLAGS)
    assert report.tool_check["not_judged"] == unscripted
    assert report.tool_check["max_tokens"] == tool_exchange.UNSCRIPTED_MAX_TOKENS
    # no tool request waited out its timeout behind the router
    assert all(f["name"] != ExitCode.UNREACHABLE.name for f in report.failures), report.message
    if spec in REFUSES_TOOL_REQUEST:
        assert REFUSES_TOOL_REQUEST[spec] in report.message
        singles = [e for e in report.exchanges if e.kind != "tools"]
        assert singles and all(e.polar["polar_trainable_tokens"] == 0 for e in singles)
    else:
        assert "it also found" not in report.message


def _prompt_tokens(url: str, messages: list[dict]) -> int:
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT).json()["usage"]["prompt_tokens"]


def test_total_token_check_is_sglangs_own(real_engine):
    messages = [{"role": "user", "content": "hello there"}]
    prompt = _prompt_tokens(real_engine.url, messages)
    context = 32768  # the tiny model's max_position_embeddings (real_sglang.MODEL_CONFIG), as GET /v1/models says
    models = httpx.get(f"{real_engine.url}/v1/models", timeout=TIMEOUT).json()
    assert models["data"][0]["max_model_len"] == context
    for max_new in (context - prompt + 1, context, context + 1000):
        body = contract.prepare_request({"model": MODEL, "messages": messages, "max_tokens": max_new})
        answer = httpx.post(f"{real_engine.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        assert answer.status_code == 400
        error = answer.json()
        expected = _fill(RECORD["facts"]["length_errors"]["total_tokens"], context, prompt, max_new)
        assert error == {"object": "error", "message": expected, "type": "BadRequestError", "param": None, "code": 400}


def _fill(template: str, context: int, prompt: int, max_new: int) -> str:
    values = {"self.context_len": context, "total_tokens": prompt + max_new, "input_token_num": prompt}
    values["max_new_tokens"] = max_new
    return re.sub(r"\{([a-z_.]+)\}", lambda m: str(values[m.group(1)]), template)


def test_the_smoke_fails_on_the_total_token_refusal_as_an_http_error(real_engine, scripted_tool_fields):
    report = smoke(real_engine.url, scripted_tool_fields, max_tokens=32768)
    assert report.code == ExitCode.HTTP_ERROR
    assert "Requested token count exceeds the model's maximum context length of 32768 tokens" in report.message


def _tool_answer(url: str, fields: dict) -> dict:
    body = {**tool_exchange.tool_request(MODEL), **fields}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_parser_returns_tool_calls(real_engine, scripted_tool_fields):
    parsed = _tool_answer(real_engine.url, scripted_tool_fields)
    outcome, calls, finish = tool_exchange.classify(parsed)
    assert (outcome, calls, finish) == (tool_exchange.PARSED, 1, "tool_calls")
    call = parsed["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == agent_turn.write_tool_name() == "Write"  # the agent's own write tool
    assert json.loads(call["function"]["arguments"]) == {"file_path": "solution.py", "content": "pass"}
    assert parsed["choices"][0]["prompt_token_ids"] and parsed["choices"][0]["meta_info"]["output_token_logprobs"]


def test_without_the_parser_the_call_stays_raw_text(real_engine_no_parser, scripted_tool_fields):
    parsed = _tool_answer(real_engine_no_parser.url, scripted_tool_fields)
    outcome, calls, finish = tool_exchange.classify(parsed)
    assert (outcome, calls, finish) == (tool_exchange.RAW_TEXT, 0, "stop")
    assert "<tool_call>" in parsed["choices"][0]["message"]["content"]
    report = smoke(real_engine_no_parser.url, scripted_tool_fields)
    assert report.code == ExitCode.TOOL_CALLS
    assert tool_parser.FLAG in report.message


def test_router_matrix_in_front_of_the_real_engine(real_engine, tmp_path, capsys):
    """`make router-matrix ENGINE=sglang` (issue 21 point 4): issue #52's bisection measured with the real engine,
    what reached it read from the relay in front of it. The key rows match the emulator's (tests/integration/
    test_matrix.py): 0.1.4 and smg 1.13.0 forward Polar's fields, 0.3.2 drops them on the way in but passes them
    back when the engine emits them, and forwards them on /v1/completions; /generate keeps its tokens; only the newer releases take POST /workers."""
    from polarstack.cli.main import main

    out_json, out_md = tmp_path / "m.json", tmp_path / "m.md"
    releases = ["sglang-router==0.1.4", "sglang-router==0.3.2", "smg==1.13.0"]
    args = ["routers", "matrix", "--releases", *releases, "--engine", "sglang", "--engine-url", real_engine.url]
    code = main([*args, "--latency-requests", "3", "--json", str(out_json), "--markdown", str(out_md)])
    assert code == 0, capsys.readouterr().err
    record = json.loads(out_json.read_text())
    assert record["engine"] == real_sglang.spec()
    rows = {r["release"]: r for r in record["rows"]}
    assert [r.get("note") for r in rows.values()] == [None, None, None], rows
    assert [rows[s]["chat_flags_reach_engine"] for s in releases] == [True, False, True]
    assert [rows[s]["chat_fields_reach_client"] for s in releases] == [True, False, True]
    assert all(r["fields_survive_when_emitted"] for r in rows.values())
    assert all(r["generate_keeps_tokens"] for r in rows.values())
    assert all(r["completions_flags_reach_engine"] for r in rows.values())  # /v1/completions forwards them
    assert [rows[s]["post_workers"] for s in releases] == [False, True, True]
    assert all(r["latency_requests"] == 3 for r in rows.values())
    text = out_md.read_text()
    assert f"(real {real_sglang.spec()})" in text and "recording relay" in text
