"""An HTTP stand-in for one sglang engine (the only stand-in the stack allows: sglang needs a GPU).

Fidelity rules:
- Requests are validated by sglang's own pydantic models from the pinned wheel (`sglang_protocol`), so
  defaults, ignored unknown fields and type errors are sglang's; validation errors answer 400 with sglang's
  ErrorResponse shape (`http_server.py`, `validation_exception_handler`), and OpenAI routes require
  `Content-Type: application/json` (`validate_json_request`).
- `/v1/chat/completions` applies `serving_chat.py`'s checks (`_validate_request`, and the rejection of
  `return_prompt_token_ids` / `return_meta_info` with `stream: true` in `_convert_to_internal_request`),
  and builds the response with sglang's response models: `prompt_token_ids` and `meta_info` appear only
  when requested (`_build_chat_response`); `logprobs.content[]` never carries token ids.
- `meta_info` has the keys tokenizer_manager.py builds (id, finish_reason, prompt_tokens, weight_version,
  num_retractions, completion_tokens, cached_tokens, reasoning_tokens, e2e_latency, and with logprobs
  input/output_token_logprobs as [logprob, token_id, text_or_None] triples).
- Tokens are deterministic for (seed, prompt ids); `cached_tokens` is the longest prefix shared with an
  earlier prompt on this engine (a per-engine prefix cache, as sglang's radix cache reports it;
  polarstack.prefix_cache).
- Service time (off by default; `emulate-engine --prefill-us-per-token/--decode-us-per-token`): uncached
  prompt tokens are prefilled one request at a time per engine (a FIFO clock: an engine that gets more
  uncached tokens queues), generated tokens cost their decode time per request (batched decode: requests
  overlap). Chat and /generate only. A model of where GPU time goes, not of sglang's scheduler.

Not sglang: the routes under `/_emulator/` (the request log tests use to prove what reached the engine,
fault injection, and `/_emulator/served`: one compact line per chat completion with its token counts and
the first characters of its last message, which a workload uses to tell which engine served which turn). sglang never serves that prefix.
"""

import asyncio
import collections
import hashlib
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from polarstack import sglang_protocol, toolcheck
from polarstack.prefix_cache import PrefixCache
from polarstack.tokenizer import ENDOFTEXT, IM_END, SPECIAL_IDS, Tokenizer, encode_chat

DEFAULT_MODEL = "Qwen2.5-7B-Instruct"
CONTEXT_LENGTH = 32768  # Qwen2.5-7B-Instruct's context length
REQUEST_LOG_SIZE = 500
PREFIX_CACHE_SIZE = 512
SERVED_LOG_SIZE = 100_000
TAG_CHARS = 64
_WORDS = ("the agent reads the file and runs the tests then fixes the bug in the function returns a value "
          "hello world sure here is code def return for in if else print list dict sum result").split()

FAULT_MODES = ("none", "delay", "http500", "html", "truncated", "nan_logprobs", "positive_logprobs",
               "length_mismatch", "no_extensions", "always_extensions", "nan_literal_logprobs")


@dataclass
class EngineState:
    model: str
    seed: int
    port: int = 0
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    requests: collections.deque = field(default_factory=lambda: collections.deque(maxlen=REQUEST_LOG_SIZE))
    prefixes: PrefixCache = field(default_factory=lambda: PrefixCache(PREFIX_CACHE_SIZE))
    served_log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=SERVED_LOG_SIZE))
    prefill_us_per_token: float = 0.0
    decode_us_per_token: float = 0.0
    prefill_busy_until: float = 0.0
    fault: dict[str, Any] = field(default_factory=lambda: {"mode": "none"})
    running: int = 0
    served: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generated_tokens_total: int = 0
    chat_completions: int = 0
    # `--tool-call-parser` of the emulated engine (None: sglang's default, no parsing; see polarstack.toolcheck).
    tool_call_parser: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cached_prefix(self, prompt: list[int]) -> int:
        """Tokens of `prompt` already in this engine's cache; then remember the prompt."""
        best = self.prefixes.match(prompt)
        # sglang never serves the whole prompt from cache: the last token is always recomputed.
        return min(best, max(len(prompt) - 1, 0))


def service_time(state: EngineState, uncached: int, generated: int) -> float:
    """Seconds the modelled engine needs for this request from now (see the module docstring), queue included."""
    if not (state.prefill_us_per_token or state.decode_us_per_token):
        return 0.0
    now = time.monotonic()
    with state.lock:  # prefill: one request at a time per engine
        start = max(now, state.prefill_busy_until)
        state.prefill_busy_until = start + uncached * state.prefill_us_per_token / 1e6
        done = state.prefill_busy_until + generated * state.decode_us_per_token / 1e6
    return done - now


@dataclass
class Generation:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    cached_tokens: int
    started: float


def _rng(seed: int, prompt: list[int], salt: int, sampling_seed: int | None) -> random.Random:
    h = hashlib.sha256()
    h.update(f"{seed}:{salt}:{sampling_seed}:".encode())
    h.update(json.dumps(prompt).encode())
    return random.Random(int.from_bytes(h.digest()[:8], "big"))


def generate(state: EngineState, prompt: list[int], max_new_tokens: int | None, *, salt: int = 0,
             sampling_seed: int | None = None, ignore_eos: bool = False, min_new_tokens: int = 0) -> Generation:
    started = time.time()
    rng = _rng(state.seed, prompt, salt, sampling_seed)
    natural = rng.randint(max(4, min_new_tokens), max(12, min_new_tokens + 1))
    limit = max_new_tokens if max_new_tokens is not None else 128
    words = [rng.choice(_WORDS) for _ in range(min(natural, limit) + 1)]
    ids = [state.tokenizer.piece_id(" " + w) for w in words][: min(natural, limit)]
    if natural < limit and not ignore_eos:
        ids.append(IM_END)  # the stop token is part of output_ids, as in sglang
        finish: dict[str, Any] = {"type": "stop", "matched": IM_END}
    else:
        ids = ids[:limit]
        finish = {"type": "length", "length": limit}
    logprobs = [round(-rng.uniform(0.0005, 3.0), 6) for _ in ids]
    cached = state.cached_prefix(prompt)
    with state.lock:
        state.prompt_tokens_total += len(prompt)
        state.cached_tokens_total += cached
        state.generated_tokens_total += len(ids)
    return Generation(ids, logprobs, finish, cached, started)


def generate_tool_call(state: EngineState, prompt: list[int], tools: list[Any], max_new_tokens: int | None, *,
                       salt: int = 0, sampling_seed: int | None = None) -> Generation:
    """The emulated model's answer when tools are offered: one Qwen-format call of the first tool, then <|im_end|>
    (deterministic; cut at max_new_tokens like any generation)."""
    started = time.time()
    rng = _rng(state.seed, prompt, salt, sampling_seed)
    limit = max_new_tokens if max_new_tokens is not None else 128
    ids = state.tokenizer.encode(toolcheck.tool_call_text(tools))
    if len(ids) < limit:
        ids.append(IM_END)
        finish: dict[str, Any] = {"type": "stop", "matched": IM_END}
    else:
        ids = ids[:limit]
        finish = {"type": "length", "length": limit}
    logprobs = [round(-rng.uniform(0.0005, 1.0), 6) for _ in ids]
    cached = state.cached_prefix(prompt)
    with state.lock:
        state.prompt_tokens_total += len(prompt)
        state.cached_tokens_total += cached
        state.generated_tokens_total += len(ids)
    return Generation(ids, logprobs, finish, cached, started)


def meta_info(state: EngineState, rid: str, prompt: list[int], gen: Generation, return_logprob: bool,
              text_in_logprobs: bool) -> dict[str, Any]:
    """The meta_info dict tokenizer_manager.py builds for a finished request."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": gen.finish_reason,
        "prompt_tokens": len(prompt),
        "weight_version": "default",
        "num_retractions": 0,
    }
    if return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [
            [lp, tid, state.tokenizer.token_text(tid) if text_in_logprobs else None]
            for lp, tid in zip(gen.logprobs, gen.output_ids)
        ]
        meta["output_token_logprobs_length"] = len(gen.output_ids)
    meta.update({"reasoning_tokens": 0, "completion_tokens": len(gen.output_ids), "cached_tokens": gen.cached_tokens,
                 "e2e_latency": round(time.time() - gen.started, 6)})
    return meta


class RequestLog:
    """Plain ASGI middleware: record every request (method, path, parsed body, x- headers) before the route runs."""

    def __init__(self, app, state: EngineState) -> None:
        self.app, self.state = app, state

    def _record(self, scope, body: bytes) -> None:
        path = scope.get("path", "")
        if path.startswith("/_emulator/"):
            return
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])
                   if k.lower().startswith((b"x-", b"content-type"))}
        self.state.requests.append({"time": time.time(), "method": scope.get("method"), "path": path,
                                    "query": scope.get("query_string", b"").decode("latin-1"), "body": parsed,
                                    "headers": headers})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        done = False

        async def logged_receive():
            nonlocal done
            message = await receive()
            if message["type"] == "http.request" and not done:
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True
                    self._record(scope, b"".join(chunks))
            return message

        if scope.get("method") in ("GET", "HEAD", "DELETE"):
            done = True
            self._record(scope, b"")
        self.state.running += 1
        try:
            await self.app(scope, logged_receive, send)
        finally:
            self.state.running -= 1
            self.state.served += 1
            if not done:
                self._record(scope, b"".join(chunks))


def _visible_text(state: EngineState, ids: list[int], skip_special: bool = True) -> str:
    return state.tokenizer.decode(ids, skip_special_tokens=skip_special).lstrip()


def create_app(state: EngineState):  # noqa: C901 - one route table, read top to bottom
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

    proto = sglang_protocol.protocol()
    GenerateReqInput = sglang_protocol.generate_model()
    app = FastAPI(title="polarstack sglang emulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RequestLog, state=state)

    def error(message: str, err_type: str = "BadRequest", status: int = 400) -> JSONResponse:
        body = proto.ErrorResponse(message=message, type=err_type, code=status).model_dump()
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        # http_server.py validation_exception_handler: 400 with the legacy ErrorResponse shape.
        exc_str, errors_str = str(exc), str(exc.errors())
        message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
        return error(message, "Bad Request", 400)

    async def validate_json_request(raw_request: Request):
        media_type = raw_request.headers.get("content-type", "").lower().split(";", 1)[0]
        if media_type != "application/json":
            raise RequestValidationError(errors=[{"loc": ["header", "content-type"], "type": "value_error",
                                                  "msg": "Unsupported Media Type: Only 'application/json' is allowed"}])

    # --- health and info (http_server.py) ------------------------------------------------------------
    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return {"model_path": state.model, "tokenizer_path": state.model, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return {"model_path": state.model, "tokenizer_path": state.model, "served_model_name": state.model,
                "host": "127.0.0.1", "port": state.port, "tp_size": 1, "pp_size": 1, "dp_size": 1, "ep_size": 1,
                "context_length": CONTEXT_LENGTH, "random_seed": state.seed, "disaggregation_mode": "null",
                "enable_cache_report": False, "skip_tokenizer_init": False, "weight_version": "default",
                "max_total_num_tokens": 400000, "internal_states": [{"last_gen_throughput": 0.0}],
                "version": sglang_protocol.sglang_version(), "kv_events": None}

    @app.get("/get_load")
    async def get_load():
        return [{"dp_rank": 0, "num_reqs": state.running, "num_waiting_reqs": 0, "num_tokens": 0,
                 "num_pending_tokens": 0, "ts_tic": time.perf_counter()}]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        with state.lock:
            state.prefixes.clear()
            state.served_log.clear()
            state.prompt_tokens_total = state.cached_tokens_total = state.generated_tokens_total = 0
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    @app.get("/v1/models")
    async def models():
        card = proto.ModelCard(id=state.model, root=state.model, max_model_len=CONTEXT_LENGTH)
        return proto.ModelList(data=[card]).model_dump()

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != state.model:
            return JSONResponse({"error": {"message": f"The model '{model}' does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        return proto.ModelCard(id=model, root=model, max_model_len=CONTEXT_LENGTH).model_dump()

    # --- fault injection -----------------------------------------------------------------------------
    async def apply_fault() -> Response | None:
        mode = state.fault.get("mode", "none")
        if mode == "delay":
            await asyncio.sleep(float(state.fault.get("seconds", 5)))
        elif mode == "http500":
            return error("Internal server error: injected fault", "InternalServerError", 500)
        elif mode == "html":
            return Response("<html><body><h1>502 Bad Gateway</h1></body></html>", status_code=502,
                            media_type="text/html")
        return None

    def corrupt(body: dict[str, Any]) -> Response | None:
        mode = state.fault.get("mode", "none")
        if mode == "truncated":
            text = json.dumps(body)
            return Response(text[: len(text) // 2], media_type="application/json")
        for choice in body.get("choices", []):
            entries = (choice.get("meta_info") or {}).get("output_token_logprobs")
            content = (choice.get("logprobs") or {}).get("content")
            if mode in ("nan_logprobs", "nan_literal_logprobs", "positive_logprobs"):
                value = 0.75 if mode == "positive_logprobs" else float("nan")
                if entries:
                    entries[0][0] = value
                if content:
                    content[0]["logprob"] = value
            elif mode == "length_mismatch" and entries:
                entries.pop()
        if mode == "nan_logprobs":
            # What the pinned sglang (SGLANG_VERSION) puts on the wire for a NaN logprob: its chat route returns the pydantic
            # ChatCompletionResponse, which FastAPI serializes in JSON mode, writing NaN as null (measured with
            # sglang's own response model under fastapi 0.165.0 / pydantic 2.13.4); orjson, behind sglang's
            # ORJSONResponse routes, also writes NaN as null. docs/polar-verdict.md has the measurement.
            return Response(orjson.dumps(body), media_type="application/json")
        if mode == "nan_literal_logprobs":
            # NOT sglang: a bare NaN literal no sglang release emits. It exists to test that the smoke parses like
            # Polar's gateway (orjson rejects the literal, so Polar records nothing).
            return Response(json.dumps(body, allow_nan=True), media_type="application/json")
        return None

    @app.get("/_emulator/requests")
    async def debug_requests(path: str | None = None, limit: int = REQUEST_LOG_SIZE):
        entries = [e for e in state.requests if path is None or e["path"] == path]
        return {"requests": entries[-limit:], "served": state.served}

    @app.delete("/_emulator/requests")
    async def debug_clear():
        state.requests.clear()
        return {"cleared": True}

    @app.get("/_emulator/stats")
    async def stats():
        """Totals since start or the last /flush_cache: what a prefix-cache-aware measurement needs."""
        return {"prompt_tokens": state.prompt_tokens_total, "cached_tokens": state.cached_tokens_total,
                "generated_tokens": state.generated_tokens_total, "served": state.served,
                "chat_completions": state.chat_completions}

    @app.get("/_emulator/served")
    async def served(since: int = 0):
        """One line per chat completion since start or the last /flush_cache (index >= since)."""
        entries = list(state.served_log)[since:]
        return {"port": state.port, "seed": state.seed, "served": entries}

    @app.get("/_emulator/fault")
    async def fault_get():
        return state.fault

    @app.post("/_emulator/fault")
    async def fault_set(raw_request: Request):
        body = await raw_request.json()
        if not isinstance(body, dict) or body.get("mode") not in FAULT_MODES:
            return error(f"mode must be one of {', '.join(FAULT_MODES)}")
        state.fault = body
        return state.fault

    # --- OpenAI chat completions (serving_chat.py) ----------------------------------------------------
    def validate_chat(request: Any) -> str | None:
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
        max_out = request.max_completion_tokens or request.max_tokens
        if max_out and max_out > CONTEXT_LENGTH:
            return (f"max_completion_tokens is too large: {max_out}."
                    f"This model supports at most {CONTEXT_LENGTH} completion tokens.")
        return None

    def chat_prompt(request: Any) -> list[int]:
        if request.input_ids:
            return list(request.input_ids)
        dumped = request.model_dump(mode="json", exclude_none=True)
        return encode_chat(state.tokenizer, dumped["messages"], tools=dumped.get("tools"),
                           continue_final_message=request.continue_final_message)

    def token_logprob(token_id: int, logprob: float, top: int, rng: random.Random) -> Any:
        text = state.tokenizer.token_text(token_id)
        tops = []
        if top:
            tops.append(proto.TopLogprob(token=text, bytes=list(text.encode()), logprob=logprob))
            for _ in range(top - 1):
                alt = state.tokenizer.token_text(state.tokenizer.piece_id(" " + rng.choice(_WORDS)))
                tops.append(proto.TopLogprob(token=alt, bytes=list(alt.encode()), logprob=logprob - rng.uniform(0.1, 4)))
        return proto.ChatCompletionTokenLogprob(token=text, bytes=list(text.encode()), logprob=logprob, top_logprobs=tops)

    @app.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
    async def chat_completions(request: proto.ChatCompletionRequest, raw_request: Request):  # type: ignore[name-defined]
        problem = validate_chat(request)
        if problem:
            return error(problem, "BadRequestError")
        if request.stream and request.return_prompt_token_ids:
            return error("return_prompt_token_ids is not supported with streaming. "
                         "Please set stream=false when using return_prompt_token_ids=true.")
        if request.stream and request.return_meta_info:
            return error("return_meta_info is not supported with streaming. "
                         "Please set stream=false when using return_meta_info=true.")
        injected = await apply_fault()
        if injected is not None:
            return injected
        with state.lock:
            state.chat_completions += 1
        prompt = chat_prompt(request)
        max_new = request.max_completion_tokens or request.max_tokens
        rid = uuid.uuid4().hex
        if request.tools:
            gens = [generate_tool_call(state, prompt, [t.model_dump() for t in request.tools], max_new, salt=i,
                                       sampling_seed=request.seed) for i in range(request.n)]
        else:
            gens = [generate(state, prompt, max_new, salt=i, sampling_seed=request.seed,
                             ignore_eos=request.ignore_eos, min_new_tokens=request.min_tokens) for i in range(request.n)]
        last = request.messages[-1].content if request.messages else None
        delay = service_time(state, sum(len(prompt) - g.cached_tokens for g in gens),
                             sum(len(g.output_ids) for g in gens))
        state.served_log.append({"time": time.time(), "prompt_tokens": len(prompt) * len(gens),
                                 "cached_tokens": sum(g.cached_tokens for g in gens),
                                 "completion_tokens": sum(len(g.output_ids) for g in gens),
                                 "service_seconds": round(delay, 6),
                                 "tag": last[:TAG_CHARS] if isinstance(last, str) else None})
        await asyncio.sleep(delay)
        extensions = state.fault.get("mode") != "no_extensions"
        # "always_extensions" is a measurement mode (not sglang's behaviour): it tells whether a router would
        # pass the fields through if an engine emitted them unasked (router-behavior.md's third column).
        forced = state.fault.get("mode") == "always_extensions"
        if request.stream:
            return StreamingResponse(chat_stream(request, prompt, gens, rid), media_type="text/event-stream")
        choices = []
        for index, gen in enumerate(gens):
            meta = meta_info(state, rid, prompt, gen, request.logprobs, True)
            rng = random.Random(index)
            logprobs = None
            if request.logprobs:
                logprobs = proto.ChoiceLogprobs(content=[token_logprob(t, lp, request.top_logprobs or 0, rng)
                                                         for t, lp in zip(gen.output_ids, gen.logprobs)])
            text = _visible_text(state, gen.output_ids, request.skip_special_tokens)
            text, tool_calls, finish_type = parse_tool_calls(request, text, gen.finish_reason["type"])
            choices.append(proto.ChatCompletionResponseChoice(
                index=index,
                message=proto.ChatMessage(role="assistant", content=text, tool_calls=tool_calls),
                logprobs=logprobs,
                finish_reason=finish_type,
                matched_stop=gen.finish_reason.get("matched"),
                prompt_token_ids=list(prompt) if (request.return_prompt_token_ids or forced) and extensions else None,
                meta_info=meta if (request.return_meta_info or forced) and extensions else None,
            ))
        completion = sum(len(g.output_ids) for g in gens)
        usage = proto.UsageInfo(prompt_tokens=len(prompt), completion_tokens=completion,
                                total_tokens=len(prompt) + completion)
        response = proto.ChatCompletionResponse(id=rid, model=request.model, choices=choices, usage=usage,
                                                metadata={"weight_version": "default"})
        body = response.model_dump()
        corrupted = corrupt(body)
        return corrupted if corrupted is not None else JSONResponse(body)

    def parse_tool_calls(request: Any, text: str, finish_type: str) -> tuple[str, list[Any] | None, str]:
        """serving_chat.py's conditions (~l.1348-1361): parse only with a parser, tools, and tool_choice != "none";
        then `_process_tool_calls` (~l.1504-1548): finish_reason "stop" becomes "tool_calls"."""
        if not (state.tool_call_parser and request.tools and request.tool_choice != "none"):
            return text, None, finish_type
        if toolcheck.QWEN_BOT not in text:
            return text, None, finish_type
        normal, calls = toolcheck.parse_qwen25(text, [t.function.name for t in request.tools])
        return normal, [proto.ToolCall(**c) for c in calls], ("tool_calls" if finish_type == "stop" else finish_type)

    async def chat_stream(request: Any, prompt: list[int], gens: list[Generation], rid: str):
        created = int(time.time())
        for index, gen in enumerate(gens):
            first = proto.ChatCompletionStreamResponse(id=rid, created=created, model=request.model, choices=[
                proto.ChatCompletionResponseStreamChoice(index=index, delta=proto.DeltaMessage(role="assistant",
                                                                                               content=""))])
            yield f"data: {first.model_dump_json()}\n\n"
            for token_id in gen.output_ids:
                if token_id in SPECIAL_IDS and request.skip_special_tokens:
                    continue
                chunk = proto.ChatCompletionStreamResponse(id=rid, created=created, model=request.model, choices=[
                    proto.ChatCompletionResponseStreamChoice(index=index, delta=proto.DeltaMessage(
                        content=state.tokenizer.token_text(token_id)))])
                yield f"data: {chunk.model_dump_json()}\n\n"
            last = proto.ChatCompletionStreamResponse(id=rid, created=created, model=request.model, choices=[
                proto.ChatCompletionResponseStreamChoice(index=index, delta=proto.DeltaMessage(),
                                                         finish_reason=gen.finish_reason["type"],
                                                         matched_stop=gen.finish_reason.get("matched"))])
            yield f"data: {last.model_dump_json()}\n\n"
        if request.stream_options and request.stream_options.include_usage:
            completion = sum(len(g.output_ids) for g in gens)
            usage = proto.UsageInfo(prompt_tokens=len(prompt), completion_tokens=completion,
                                    total_tokens=len(prompt) + completion)
            tail = proto.ChatCompletionStreamResponse(id=rid, created=created, model=request.model, choices=[],
                                                      usage=usage)
            yield f"data: {tail.model_dump_json()}\n\n"
        yield "data: [DONE]\n\n"

    # --- OpenAI completions (serving_completions.py) --------------------------------------------------
    @app.post("/v1/completions", dependencies=[Depends(validate_json_request)])
    async def completions(request: proto.CompletionRequest):  # type: ignore[name-defined]
        prompts = request.prompt
        if isinstance(prompts, str):
            prompt_ids_list = [state.tokenizer.encode(prompts)]
        elif prompts and isinstance(prompts[0], int):
            prompt_ids_list = [list(prompts)]
        elif prompts and isinstance(prompts[0], list):
            prompt_ids_list = [list(p) for p in prompts]
        else:
            prompt_ids_list = [state.tokenizer.encode(p) for p in prompts]
        if not prompt_ids_list or not all(prompt_ids_list):
            return error("Prompt cannot be empty")
        choices, prompt_total, completion_total = [], 0, 0
        for p_index, prompt in enumerate(prompt_ids_list):
            prompt_total += len(prompt)
            for n in range(request.n):
                gen = generate(state, prompt, request.max_tokens, salt=n, sampling_seed=request.seed,
                               ignore_eos=request.ignore_eos, min_new_tokens=request.min_tokens)
                completion_total += len(gen.output_ids)
                logprobs = None
                if request.logprobs is not None:
                    tokens = [state.tokenizer.token_text(t) for t in gen.output_ids]
                    offsets, pos = [], 0
                    for tok in tokens:
                        offsets.append(pos)
                        pos += len(tok)
                    logprobs = proto.LogProbs(text_offset=offsets, token_logprobs=gen.logprobs, tokens=tokens,
                                              top_logprobs=[{tok: lp} for tok, lp in zip(tokens, gen.logprobs)]
                                              if request.logprobs else [])
                choices.append(proto.CompletionResponseChoice(
                    index=len(choices), text=_visible_text(state, gen.output_ids, request.skip_special_tokens),
                    logprobs=logprobs, finish_reason=gen.finish_reason["type"],
                    matched_stop=gen.finish_reason.get("matched")))
        usage = proto.UsageInfo(prompt_tokens=prompt_total, completion_tokens=completion_total,
                                total_tokens=prompt_total + completion_total)
        return proto.CompletionResponse(id=uuid.uuid4().hex, model=request.model, choices=choices,
                                        usage=usage).model_dump()

    # --- tokenize / detokenize (serving_tokenize.py) --------------------------------------------------
    @app.post("/v1/tokenize", dependencies=[Depends(validate_json_request)])
    @app.post("/tokenize", dependencies=[Depends(validate_json_request)], include_in_schema=False)
    async def tokenize(request: proto.TokenizeRequest):  # type: ignore[name-defined]
        if request.messages is not None:
            dumped = request.model_dump(mode="json", exclude_none=True)
            tokens: Any = encode_chat(state.tokenizer, dumped["messages"], tools=dumped.get("tools"),
                                      continue_final_message=request.continue_final_message)
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

    # --- native /generate (http_server.py generate_request, io_struct.GenerateReqInput) ---------------
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate_route(obj: GenerateReqInput):  # type: ignore[valid-type]
        if obj.text is None and obj.input_ids is None and obj.input_embeds is None:
            return JSONResponse({"error": {"message": "Either text, input_ids or input_embeds should be provided."}},
                                status_code=400)
        if isinstance(obj.text, list) or (obj.input_ids and isinstance(obj.input_ids[0], list)):
            items = obj.text if obj.text is not None else obj.input_ids
        else:
            items = [obj.text if obj.text is not None else obj.input_ids]
        params = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
        max_new = params.get("max_new_tokens", 128)
        outputs = []
        for item in items:
            prompt = state.tokenizer.encode(item) if isinstance(item, str) else list(item)
            gen = generate(state, prompt, max_new, sampling_seed=params.get("sampling_seed"),
                           ignore_eos=bool(params.get("ignore_eos", False)),
                           min_new_tokens=int(params.get("min_new_tokens", 0) or 0))
            await asyncio.sleep(service_time(state, len(prompt) - gen.cached_tokens, len(gen.output_ids)))
            rid = uuid.uuid4().hex
            outputs.append({
                "text": _visible_text(state, gen.output_ids, params.get("skip_special_tokens", True)),
                "output_ids": gen.output_ids,
                "meta_info": meta_info(state, rid, prompt, gen, bool(obj.return_logprob),
                                       bool(obj.return_text_in_logprobs)),
            })
            if getattr(obj, "return_prompt_token_ids", False):
                outputs[-1]["prompt_token_ids"] = prompt
        return JSONResponse(outputs if len(outputs) > 1 or isinstance(obj.text, list) else outputs[0])

    return app


def serve(port: int, host: str = "127.0.0.1", model: str = DEFAULT_MODEL, seed: int = 0,
          tool_call_parser: str | None = None, prefill_us_per_token: float = 0.0,
          decode_us_per_token: float = 0.0) -> None:
    """Run the emulator in the foreground until interrupted."""
    import uvicorn

    state = EngineState(model=model, seed=seed, port=port, tool_call_parser=tool_call_parser,
                        prefill_us_per_token=prefill_us_per_token, decode_us_per_token=decode_us_per_token)
    app = create_app(state)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    print(f"polarstack: sglang {sglang_protocol.sglang_version()} emulator serving {model} on http://{host}:{port}",
          flush=True)
    server.run()


__all__ = ["EngineState", "create_app", "serve", "generate", "DEFAULT_MODEL", "ENDOFTEXT"]
