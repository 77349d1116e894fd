"""OpenAI chat completions (`POST /v1/chat/completions`), streamed or not, with sglang's extension fields.

Mirrors sglang/srt/entrypoints/openai/serving_chat.py: `_validate_request`, the rejection of
`return_prompt_token_ids` / `return_meta_info` with `stream: true` (`_convert_to_internal_request`),
`_build_chat_response` (`prompt_token_ids` and `meta_info` only when requested; `logprobs.content[]` never carries
token ids) and the tool-call parsing (`_process_tool_calls`, via polarstack.engine.tool_parser).
"""

import asyncio
import random
import time
import uuid
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from polarstack.engine import protocol as sglang_protocol
from polarstack.engine import tool_parser
from polarstack.engine.emulator.engine import (
    TAG_CHARS,
    WORDS,
    EngineState,
    Generation,
    generate,
    generate_tool_call,
    meta_info,
    service_time,
    visible_text,
)
from polarstack.engine.emulator.errors import error, validate_json_request
from polarstack.engine.emulator.faults import apply_fault, corrupt
from polarstack.engine.emulator.sse_utils import build_sse_content
from polarstack.engine.emulator.tokenizer_manager import length_problem
from polarstack.polar.tokenizer import SPECIAL_IDS, encode_chat


def validate_chat(request: Any) -> str | None:
    """serving_chat.py `_validate_request`: the message of a request sglang refuses, or None."""
    if not request.messages:
        return "Messages cannot be empty."
    tool_choice = request.tool_choice
    if isinstance(tool_choice, str) and tool_choice.lower() == "required" and not request.tools:
        return "Tools cannot be empty if tool choice is set to required."
    if tool_choice is not None and not isinstance(tool_choice, str):
        if not request.tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        name = tool_choice.function.name
        if not any(tool.function.name == name for tool in request.tools):
            return f"Tool '{name}' not found in tools list."
    # serving_chat.py ~l.517-527 also refuses max_completion_tokens above `server_args.context_length`, which is
    # None unless the server runs with --context-length (the stack's engines do not): a long request is refused by
    # tokenizer_manager.py's total-token check instead (polarstack.engine.emulator.tokenizer_manager).
    return None


def chat_prompt(state: EngineState, request: Any) -> list[int]:
    """The prompt ids: `input_ids` when given, else the chat template applied to the messages (and tools)."""
    if request.input_ids:
        return list(request.input_ids)
    dumped = request.model_dump(mode="json", exclude_none=True)
    return encode_chat(
        state.tokenizer,
        dumped["messages"],
        tools=dumped.get("tools"),
        continue_final_message=request.continue_final_message,
    )


def token_logprob(state: EngineState, token_id: int, logprob: float, top: int, rng: random.Random) -> Any:
    proto = sglang_protocol.protocol()
    text = state.tokenizer.token_text(token_id)
    tops = []
    if top:
        tops.append(proto.TopLogprob(token=text, bytes=list(text.encode()), logprob=logprob))
        for _ in range(top - 1):
            alt = state.tokenizer.token_text(state.tokenizer.piece_id(" " + rng.choice(WORDS)))
            tops.append(proto.TopLogprob(token=alt, bytes=list(alt.encode()), logprob=logprob - rng.uniform(0.1, 4)))
    return proto.ChatCompletionTokenLogprob(token=text, bytes=list(text.encode()), logprob=logprob, top_logprobs=tops)


def parse_tool_calls(
    state: EngineState, request: Any, text: str, finish_type: str
) -> tuple[str, list[Any] | None, str]:
    """serving_chat.py's conditions (~l.1348-1361): parse only with a parser, tools, and tool_choice != "none";
    then `_process_tool_calls` (~l.1504-1548): finish_reason "stop" becomes "tool_calls"."""
    if not (state.tool_call_parser and request.tools and request.tool_choice != "none"):
        return text, None, finish_type
    if tool_parser.QWEN_BOT not in text:
        return text, None, finish_type
    normal, calls = tool_parser.parse_qwen25(text, [t.function.name for t in request.tools])
    proto = sglang_protocol.protocol()
    return normal, [proto.ToolCall(**c) for c in calls], ("tool_calls" if finish_type == "stop" else finish_type)


async def chat_stream(state: EngineState, request: Any, prompt: list[int], gens: list[Generation], rid: str):
    """The server-sent events of a streamed chat completion, one choice after the other, then [DONE]."""
    proto = sglang_protocol.protocol()
    created = int(time.time())
    for index, gen in enumerate(gens):
        # serving_chat.py `_generate_chat_stream`: a role chunk, one content chunk per token, a finish chunk,
        # each written by sse_utils.build_sse_content (polarstack.engine.emulator.sse_utils)
        yield build_sse_content(rid, created, request.model, index, role="assistant", content="")
        for token_id in gen.output_ids:
            if token_id in SPECIAL_IDS and request.skip_special_tokens:
                continue
            yield build_sse_content(rid, created, request.model, index, content=state.tokenizer.token_text(token_id))
        yield build_sse_content(
            rid,
            created,
            request.model,
            index,
            finish_reason=gen.finish_reason["type"],
            matched_stop=gen.finish_reason.get("matched"),
        )
    if request.stream_options and request.stream_options.include_usage:
        completion = sum(len(g.output_ids) for g in gens)
        usage = proto.UsageInfo(
            prompt_tokens=len(prompt), completion_tokens=completion, total_tokens=len(prompt) + completion
        )
        tail = proto.ChatCompletionStreamResponse(id=rid, created=created, model=request.model, choices=[], usage=usage)
        yield f"data: {tail.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"


def add_routes(app: FastAPI, state: EngineState) -> None:
    proto = sglang_protocol.protocol()

    @app.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
    async def chat_completions(request: proto.ChatCompletionRequest, raw_request: Request):  # type: ignore[name-defined]
        problem = validate_chat(request)
        if problem:
            return error(problem, "BadRequestError")
        if request.stream and request.return_prompt_token_ids:
            return error(
                "return_prompt_token_ids is not supported with streaming. "
                "Please set stream=false when using return_prompt_token_ids=true."
            )
        if request.stream and request.return_meta_info:
            return error(
                "return_meta_info is not supported with streaming. "
                "Please set stream=false when using return_meta_info=true."
            )
        injected = await apply_fault(state)
        if injected is not None:
            return injected
        prompt = chat_prompt(state, request)
        max_new = request.max_completion_tokens or request.max_tokens
        too_long = length_problem(len(prompt), max_new)
        if too_long:
            return error(too_long, "BadRequestError")
        with state.lock:
            state.chat_completions += 1
        rid = uuid.uuid4().hex
        if request.tools:
            gens = [
                generate_tool_call(
                    state, prompt, [t.model_dump() for t in request.tools], max_new, salt=i, sampling_seed=request.seed
                )
                for i in range(request.n)
            ]
        else:
            gens = [
                generate(
                    state,
                    prompt,
                    max_new,
                    salt=i,
                    sampling_seed=request.seed,
                    ignore_eos=request.ignore_eos,
                    min_new_tokens=request.min_tokens,
                )
                for i in range(request.n)
            ]
        last = request.messages[-1].content if request.messages else None
        delay = service_time(
            state, sum(len(prompt) - g.cached_tokens for g in gens), sum(len(g.output_ids) for g in gens)
        )
        state.served_log.append(
            {
                "time": time.time(),
                "prompt_tokens": len(prompt) * len(gens),
                "cached_tokens": sum(g.cached_tokens for g in gens),
                "completion_tokens": sum(len(g.output_ids) for g in gens),
                "service_seconds": round(delay, 6),
                "tag": last[:TAG_CHARS] if isinstance(last, str) else None,
            }
        )
        await asyncio.sleep(delay)
        extensions = state.fault.get("mode") != "no_extensions"
        # "always_extensions" is a measurement mode (not sglang's behaviour): it tells whether a router would
        # pass the fields through if an engine emitted them unasked (router-behavior.md's third column).
        forced = state.fault.get("mode") == "always_extensions"
        if request.stream:
            return StreamingResponse(chat_stream(state, request, prompt, gens, rid), media_type="text/event-stream")
        choices = []
        for index, gen in enumerate(gens):
            meta = meta_info(state, rid, prompt, gen, request.logprobs, True)
            rng = random.Random(index)
            logprobs = None
            if request.logprobs:
                top = request.top_logprobs or 0
                logprobs = proto.ChoiceLogprobs(
                    content=[
                        token_logprob(state, t, lp, top, rng)
                        for t, lp in zip(gen.output_ids, gen.logprobs, strict=False)
                    ]
                )
            text = visible_text(state, gen.output_ids, request.skip_special_tokens)
            text, tool_calls, finish_type = parse_tool_calls(state, request, text, gen.finish_reason["type"])
            matched = gen.finish_reason.get("matched")
            if finish_type == "tool_calls" and gen.finish_reason["type"] == "stop":
                # serving_chat.py `_process_tool_calls` (~l.1528) rewrites the finish_reason dict in place, which
                # meta_info shares: {"type": "tool_calls", "matched": None}, and matched_stop becomes null
                matched = None
                meta["finish_reason"] = {"type": "tool_calls", "matched": None}
            choices.append(
                proto.ChatCompletionResponseChoice(
                    index=index,
                    message=proto.ChatMessage(role="assistant", content=text, tool_calls=tool_calls),
                    logprobs=logprobs,
                    finish_reason=finish_type,
                    matched_stop=matched,
                    prompt_token_ids=list(prompt)
                    if (request.return_prompt_token_ids or forced) and extensions
                    else None,
                    meta_info=meta if (request.return_meta_info or forced) and extensions else None,
                )
            )
        completion = sum(len(g.output_ids) for g in gens)
        usage = proto.UsageInfo(
            prompt_tokens=len(prompt), completion_tokens=completion, total_tokens=len(prompt) + completion
        )
        response = proto.ChatCompletionResponse(
            id=rid, model=request.model, choices=choices, usage=usage, metadata={"weight_version": "default"}
        )
        body = response.model_dump()
        corrupted = corrupt(state, body)
        return corrupted if corrupted is not None else JSONResponse(body)
