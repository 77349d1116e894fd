"""Pins the engine emulator's fidelity to the pinned sglang: validation, extension fields only when asked,
sglang's rejection of the return_* flags with streaming, deterministic tokens, multi-turn prefixes, request log."""

import json

import httpx
import pytest

from polarstack.engine import protocol as sglang_protocol

pytestmark = pytest.mark.emulator

CHAT = {
    "model": "Qwen2.5-7B-Instruct",
    "messages": [{"role": "user", "content": "Say hi in 5 words"}],
    "max_tokens": 12,
    "logprobs": True,
}


def post(engine, path, body, **kw):
    return httpx.post(engine.url + path, json=body, timeout=10, **kw)


def test_extension_fields_only_when_requested(engine):
    plain = post(engine, "/v1/chat/completions", CHAT).json()["choices"][0]
    assert "prompt_token_ids" not in plain and "meta_info" not in plain
    asked = post(engine, "/v1/chat/completions", dict(CHAT, return_prompt_token_ids=True, return_meta_info=True)).json()
    choice = asked["choices"][0]
    assert len(choice["prompt_token_ids"]) == asked["usage"]["prompt_tokens"]
    entries = choice["meta_info"]["output_token_logprobs"]
    assert len(entries) == asked["usage"]["completion_tokens"] == choice["meta_info"]["completion_tokens"]
    assert all(len(e) == 3 and e[0] <= 0 for e in entries)
    # plain sglang never puts token ids into OpenAI-style logprobs
    assert all("token_id" not in item for item in choice["logprobs"]["content"])


@pytest.mark.parametrize("flag", ["return_prompt_token_ids", "return_meta_info"])
def test_flags_rejected_with_streaming_like_sglang(engine, flag):
    reply = post(engine, "/v1/chat/completions", dict(CHAT, stream=True, **{flag: True}))
    assert reply.status_code == 400
    assert reply.json()["message"].startswith(f"{flag} is not supported with streaming")


def test_streaming_without_flags_works(engine):
    with httpx.stream(
        "POST",
        engine.url + "/v1/chat/completions",
        json=dict(CHAT, stream=True, stream_options={"include_usage": True}),
        timeout=10,
    ) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_validation_errors_are_sglang_400s(engine):
    reply = post(engine, "/v1/chat/completions", dict(CHAT, max_tokens="many"))
    assert reply.status_code == 400 and reply.json()["object"] == "error"
    assert (
        post(engine, "/v1/chat/completions", dict(CHAT, messages=[])).json()["message"] == "Messages cannot be empty."
    )
    reply = httpx.post(
        engine.url + "/v1/chat/completions",
        content=json.dumps(CHAT),
        headers={"Content-Type": "text/plain"},
        timeout=10,
    )
    assert reply.status_code == 400 and "Unsupported Media Type" in reply.text


def test_unknown_fields_are_ignored_and_logged(engine):
    engine.clear()
    reply = post(engine, "/v1/chat/completions", dict(CHAT, some_future_flag=True))
    assert reply.status_code == 200
    assert engine.requests()[-1]["body"]["some_future_flag"] is True


def test_deterministic_for_a_seed(engine, engine_factory):
    body = dict(CHAT, return_meta_info=True)
    first = post(engine, "/v1/chat/completions", body).json()["choices"][0]["meta_info"]["output_token_logprobs"]
    again = post(engine, "/v1/chat/completions", body).json()["choices"][0]["meta_info"]["output_token_logprobs"]
    assert first == again
    other = engine_factory(seed=7)
    different = post(other, "/v1/chat/completions", body).json()["choices"][0]["meta_info"]["output_token_logprobs"]
    assert different != first


def test_multi_turn_prompt_extends_previous_turn(engine):
    flags = {"return_prompt_token_ids": True, "return_meta_info": True}
    one = post(engine, "/v1/chat/completions", dict(CHAT, **flags)).json()
    messages = CHAT["messages"] + [
        {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And again"},
    ]
    two = post(engine, "/v1/chat/completions", dict(CHAT, messages=messages, **flags)).json()
    p1, p2 = one["choices"][0]["prompt_token_ids"], two["choices"][0]["prompt_token_ids"]
    assert len(p2) > len(p1) and p2[: len(p1)] == p1
    assert two["choices"][0]["meta_info"]["cached_tokens"] >= len(p1) - 1


def test_generate_keeps_meta_info(engine):
    out = post(
        engine, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
    ).json()
    assert len(out["output_ids"]) == 4
    assert [e[1] for e in out["meta_info"]["output_token_logprobs"]] == out["output_ids"]
    bad = post(engine, "/generate", {"sampling_params": {}})
    assert bad.status_code == 400 and "Either text, input_ids" in bad.json()["error"]["message"]


def test_tokenize_detokenize_roundtrip(engine):
    tokens = post(engine, "/v1/tokenize", {"prompt": "def f(x): return x"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    text = post(engine, "/v1/detokenize", {"tokens": tokens["tokens"]}).json()["text"]
    assert text == "def f(x): return x"
    chat = post(engine, "/v1/tokenize", {"messages": CHAT["messages"]}).json()
    direct = post(engine, "/v1/chat/completions", dict(CHAT, return_prompt_token_ids=True)).json()
    assert chat["tokens"] == direct["choices"][0]["prompt_token_ids"]


def test_info_routes(engine):
    assert httpx.get(engine.url + "/health").status_code == 200
    assert httpx.get(engine.url + "/v1/models").json()["data"][0]["id"] == "Qwen2.5-7B-Instruct"
    assert httpx.get(engine.url + "/v1/models/nope").status_code == 404
    assert httpx.get(engine.url + "/server_info").json()["version"] == sglang_protocol.sglang_version()
    assert httpx.get(engine.url + "/model_info").json()["is_generation"] is True
    assert isinstance(httpx.get(engine.url + "/get_load").json(), list)
    assert httpx.post(engine.url + "/flush_cache").status_code == 200


def test_every_emulated_route_exists_in_the_pinned_sglang(engine):
    from polarstack.engine.emulator.app import create_app
    from polarstack.engine.emulator.engine import EngineState

    real = set(sglang_protocol.http_routes())
    app = create_app(EngineState(model="m", seed=0))
    served = {
        (method, route.path)
        for route in app.routes
        for method in getattr(route, "methods", set())
        if not route.path.startswith("/_emulator/") and method != "HEAD"
    }
    assert served, "the emulator serves routes"
    assert served <= real, f"routes sglang does not have: {sorted(served - real)}"


def test_a_nan_logprob_goes_on_the_wire_as_sglang_writes_it():
    """sglang's chat route returns its pydantic ChatCompletionResponse and FastAPI serializes it in JSON mode: a NaN
    logprob becomes null (this is the measurement the emulator's nan_logprobs fault reproduces)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    proto = sglang_protocol.protocol()
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        logprobs = proto.ChoiceLogprobs(
            content=[proto.ChatCompletionTokenLogprob(token="a", bytes=[97], logprob=float("nan"), top_logprobs=[])]
        )
        choice = proto.ChatCompletionResponseChoice(
            index=0,
            message=proto.ChatMessage(role="assistant", content="a"),
            logprobs=logprobs,
            finish_reason="stop",
            meta_info={"output_token_logprobs": [[float("nan"), 5, None]]},
        )
        return proto.ChatCompletionResponse(
            id="x",
            model="m",
            choices=[choice],
            usage=proto.UsageInfo(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        )

    body = TestClient(app).post("/v1/chat/completions").content
    assert b"NaN" not in body and b'"logprob":null' in body and b"[null,5,null]" in body


@pytest.mark.parametrize("mode,literal", [("nan_logprobs", False), ("nan_literal_logprobs", True)])
def test_nan_faults_null_like_sglang_or_a_labelled_literal(engine_factory, mode, literal):
    engine = engine_factory()
    engine.fault(mode)
    body = post(
        engine,
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "return_meta_info": True},
    ).content
    assert (b"NaN" in body) is literal and (b"[null," in body) is not literal
