"""OpenAI completions (`POST /v1/completions`): a text, ids, or a batch of either as the prompt.

Mirrors sglang/srt/entrypoints/openai/serving_completions.py (the request it accepts and the response it builds,
with sglang's own models).
"""

import uuid

from fastapi import Depends, FastAPI

from polarstack.engine import protocol as sglang_protocol
from polarstack.engine.emulator.engine import EngineState, generate, visible_text
from polarstack.engine.emulator.errors import error, validate_json_request


def add_routes(app: FastAPI, state: EngineState) -> None:
    proto = sglang_protocol.protocol()

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
        for prompt in prompt_ids_list:
            prompt_total += len(prompt)
            for n in range(request.n):
                gen = generate(
                    state,
                    prompt,
                    request.max_tokens,
                    salt=n,
                    sampling_seed=request.seed,
                    ignore_eos=request.ignore_eos,
                    min_new_tokens=request.min_tokens,
                )
                completion_total += len(gen.output_ids)
                logprobs = None
                if request.logprobs is not None:
                    tokens = [state.tokenizer.token_text(t) for t in gen.output_ids]
                    offsets, pos = [], 0
                    for tok in tokens:
                        offsets.append(pos)
                        pos += len(tok)
                    logprobs = proto.LogProbs(
                        text_offset=offsets,
                        token_logprobs=gen.logprobs,
                        tokens=tokens,
                        top_logprobs=[{tok: lp} for tok, lp in zip(tokens, gen.logprobs, strict=False)]
                        if request.logprobs
                        else [],
                    )
                choices.append(
                    proto.CompletionResponseChoice(
                        index=len(choices),
                        text=visible_text(state, gen.output_ids, request.skip_special_tokens),
                        logprobs=logprobs,
                        finish_reason=gen.finish_reason["type"],
                        matched_stop=gen.finish_reason.get("matched"),
                    )
                )
        usage = proto.UsageInfo(
            prompt_tokens=prompt_total, completion_tokens=completion_total, total_tokens=prompt_total + completion_total
        )
        return proto.CompletionResponse(
            id=uuid.uuid4().hex, model=request.model, choices=choices, usage=usage
        ).model_dump()
