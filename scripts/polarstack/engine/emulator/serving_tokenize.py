"""OpenAI-style tokenize / detokenize (`/v1/tokenize`, `/v1/detokenize` and their unprefixed aliases).

Mirrors sglang/srt/entrypoints/openai/serving_tokenize.py (messages go through the chat template, as a chat
completion's prompt does); the routes as http_server.py `openai_v1_tokenize` / `openai_v1_detokenize` declare them.
"""

from typing import Any

from fastapi import Depends, FastAPI

from polarstack.engine import protocol as sglang_protocol
from polarstack.engine.emulator.engine import CONTEXT_LENGTH, EngineState
from polarstack.engine.emulator.errors import validate_json_request
from polarstack.polar.tokenizer import encode_chat


def add_routes(app: FastAPI, state: EngineState) -> None:
    proto = sglang_protocol.protocol()

    @app.post("/v1/tokenize", dependencies=[Depends(validate_json_request)])
    @app.post("/tokenize", dependencies=[Depends(validate_json_request)], include_in_schema=False)
    async def tokenize(request: proto.TokenizeRequest):  # type: ignore[name-defined]
        if request.messages is not None:
            dumped = request.model_dump(mode="json", exclude_none=True)
            tokens: Any = encode_chat(
                state.tokenizer,
                dumped["messages"],
                tools=dumped.get("tools"),
                continue_final_message=request.continue_final_message,
            )
            count: Any = len(tokens)
        elif isinstance(request.prompt, str):
            tokens = state.tokenizer.encode(request.prompt)
            count = len(tokens)
        else:
            tokens = [state.tokenizer.encode(p) for p in request.prompt]
            count = [len(t) for t in tokens]
        return proto.TokenizeResponse(tokens=tokens, count=count, max_model_len=CONTEXT_LENGTH).model_dump()

    @app.post("/v1/detokenize", dependencies=[Depends(validate_json_request)])
    @app.post("/detokenize", dependencies=[Depends(validate_json_request)], include_in_schema=False)
    async def detokenize(request: proto.DetokenizeRequest):  # type: ignore[name-defined]
        tokens = request.tokens
        if tokens and isinstance(tokens[0], list):
            text: Any = [state.tokenizer.decode(t, request.skip_special_tokens) for t in tokens]
        else:
            text = state.tokenizer.decode(tokens, request.skip_special_tokens)
        return proto.DetokenizeResponse(text=text).model_dump()
