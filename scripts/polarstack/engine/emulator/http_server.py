"""sglang's native routes: /health, /model_info, /server_info, /get_load, /flush_cache, /v1/models and /generate.

Mirrors sglang/srt/entrypoints/http_server.py (`health_generate`, `get_model_info`, `get_server_info`,
`get_load`, `flush_cache`, `available_models` / `retrieve_model`, `generate_request`); /generate validates with
io_struct.GenerateReqInput from the pinned wheel (polarstack.engine.protocol.generate_model).
"""

import asyncio
import time
import uuid

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from polarstack.engine import protocol as sglang_protocol
from polarstack.engine.emulator.engine import (
    CONTEXT_LENGTH,
    EngineState,
    generate,
    meta_info,
    service_time,
    visible_text,
)


def add_routes(app: FastAPI, state: EngineState) -> None:  # noqa: C901 - one route table
    proto = sglang_protocol.protocol()
    GenerateReqInput = sglang_protocol.generate_model()

    # --- health and info ------------------------------------------------------------------------------
    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        return Response(status_code=200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return {
            "model_path": state.model,
            "tokenizer_path": state.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return {
            "model_path": state.model,
            "tokenizer_path": state.model,
            "served_model_name": state.model,
            "host": "127.0.0.1",
            "port": state.port,
            "tp_size": 1,
            "pp_size": 1,
            "dp_size": 1,
            "ep_size": 1,
            "context_length": CONTEXT_LENGTH,
            "random_seed": state.seed,
            "disaggregation_mode": "null",
            "enable_cache_report": False,
            "skip_tokenizer_init": False,
            "weight_version": "default",
            "max_total_num_tokens": 400000,
            "internal_states": [{"last_gen_throughput": 0.0}],
            "version": sglang_protocol.sglang_version(),
            "kv_events": None,
        }

    @app.get("/get_load")
    async def get_load():
        return [
            {
                "dp_rank": 0,
                "num_reqs": state.running,
                "num_waiting_reqs": 0,
                "num_tokens": 0,
                "num_pending_tokens": 0,
                "ts_tic": time.perf_counter(),
            }
        ]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        with state.lock:
            state.prefixes.clear()
            state.served_log.clear()
            state.prompt_tokens_total = state.cached_tokens_total = state.generated_tokens_total = 0
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    @app.get("/v1/models")
    async def models():
        card = proto.ModelCard(id=state.model, root=state.model, max_model_len=CONTEXT_LENGTH)
        return proto.ModelList(data=[card]).model_dump()

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if model != state.model:
            return JSONResponse(
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                status_code=404,
            )
        return proto.ModelCard(id=model, root=model, max_model_len=CONTEXT_LENGTH).model_dump()

    # --- native /generate (generate_request, io_struct.GenerateReqInput) ----------------------------------
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate_route(obj: GenerateReqInput):  # type: ignore[valid-type]
        if obj.text is None and obj.input_ids is None and obj.input_embeds is None:
            return JSONResponse(
                {"error": {"message": "Either text, input_ids or input_embeds should be provided."}}, status_code=400
            )
        if isinstance(obj.text, list) or (obj.input_ids and isinstance(obj.input_ids[0], list)):
            items = obj.text if obj.text is not None else obj.input_ids
        else:
            items = [obj.text if obj.text is not None else obj.input_ids]
        params = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
        max_new = params.get("max_new_tokens", 128)
        outputs = []
        for item in items:
            prompt = state.tokenizer.encode(item) if isinstance(item, str) else list(item)
            gen = generate(
                state,
                prompt,
                max_new,
                sampling_seed=params.get("sampling_seed"),
                ignore_eos=bool(params.get("ignore_eos", False)),
                min_new_tokens=int(params.get("min_new_tokens", 0) or 0),
            )
            await asyncio.sleep(service_time(state, len(prompt) - gen.cached_tokens, len(gen.output_ids)))
            rid = uuid.uuid4().hex
            outputs.append(
                {
                    "text": visible_text(state, gen.output_ids, params.get("skip_special_tokens", True)),
                    "output_ids": gen.output_ids,
                    "meta_info": meta_info(
                        state, rid, prompt, gen, bool(obj.return_logprob), bool(obj.return_text_in_logprobs)
                    ),
                }
            )
            if getattr(obj, "return_prompt_token_ids", False):
                outputs[-1]["prompt_token_ids"] = prompt
        return JSONResponse(outputs if len(outputs) > 1 or isinstance(obj.text, list) else outputs[0])
