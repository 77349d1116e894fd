"""An HTTP stand-in for one sglang engine (the only stand-in the stack allows: sglang needs a GPU), as a package.

One module per sglang file it stands in for (each names its file): engine (state, generation, prefix cache,
service time), request_log, faults, errors, http_server (native routes), serving_chat, serving_completions,
serving_tokenize, debug (`/_emulator/`), app (create_app, serve).

Fidelity rules:
- Requests are validated by sglang's own pydantic models from the pinned wheel (`polarstack.engine.protocol`), so
  defaults, ignored unknown fields and type errors are sglang's; validation errors answer 400 with sglang's
  ErrorResponse shape (`http_server.py`, `validation_exception_handler`), and OpenAI routes require
  `Content-Type: application/json` (`validate_json_request`).
- `/v1/chat/completions` applies `serving_chat.py`'s checks (`_validate_request`, and the rejection of
  `return_prompt_token_ids` / `return_meta_info` with `stream: true` in `_convert_to_internal_request`),
  and builds the response with sglang's response models: `prompt_token_ids` and `meta_info` appear only
  when requested (`_build_chat_response`); `logprobs.content[]` never carries token ids.
- `meta_info` has the keys tokenizer_manager.py builds (id, finish_reason, prompt_tokens, weight_version,
  num_retractions, reasoning_tokens, completion_tokens, cached_tokens, cached_tokens_details, dp_rank, e2e_latency,
  response_sent_to_client_ts, and with logprobs
  input/output_token_logprobs as [logprob, token_id, text_or_None] triples).
- Tokens are deterministic for (seed, prompt ids); `cached_tokens` is the longest prefix shared with an
  earlier prompt on this engine (a per-engine prefix cache, as sglang's radix cache reports it;
  polarstack.engine.prefix_cache).
- Service time (off by default; `emulate-engine --prefill-us-per-token/--decode-us-per-token`): uncached
  prompt tokens are prefilled one request at a time per engine (a FIFO clock: an engine that gets more
  uncached tokens queues), generated tokens cost their decode time per request (batched decode: requests
  overlap). Chat and /generate only. A model of where GPU time goes, not of sglang's scheduler.

Not sglang: the routes under `/_emulator/` (the request log tests use to prove what reached the engine,
fault injection, and `/_emulator/served`: one compact line per chat completion with its token counts and
the first characters of its last message, which a workload uses to tell which engine served which turn). sglang
never serves that prefix.
"""
