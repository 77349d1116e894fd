"""The emulated engine's state and generation: what sglang's scheduler and tokenizer manager do for a request.

Mirrors sglang/srt/managers/tokenizer_manager.py (the `meta_info` dict of a finished request) and, as a model
only, the scheduler (sglang/srt/managers/scheduler.py): deterministic tokens for (seed, prompt ids), the
per-engine prefix cache `cached_tokens` reports (polarstack.engine.prefix_cache, as sglang's radix cache does), and the
service-time clock (see the package docstring).
"""

import collections
import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from polarstack.engine import tool_parser
from polarstack.engine.prefix_cache import PrefixCache
from polarstack.polar.tokenizer import IM_END, Tokenizer

DEFAULT_MODEL = "Qwen2.5-7B-Instruct"
CONTEXT_LENGTH = 32768  # Qwen2.5-7B-Instruct's context length
REQUEST_LOG_SIZE = 500
PREFIX_CACHE_SIZE = 512
SERVED_LOG_SIZE = 100_000
TAG_CHARS = 64
WORDS = (
    "the agent reads the file and runs the tests then fixes the bug in the function returns a value "
    "hello world sure here is code def return for in if else print list dict sum result"
).split()


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
    # `--tool-call-parser` of the emulated engine (None: sglang's default, no parsing; see polarstack.engine.tool_parser).
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


def _end(ids: list[int], stops: bool, limit: int) -> tuple[list[int], dict[str, Any]]:
    """The output ids and finish_reason: ended by the stop token (part of output_ids, as in sglang) or cut at limit."""
    if stops:
        return ids + [IM_END], {"type": "stop", "matched": IM_END}
    return ids[:limit], {"type": "length", "length": limit}


def _served(
    state: EngineState, prompt: list[int], ids: list[int], logprobs: list[float], finish: dict[str, Any], started: float
) -> Generation:
    """The finished generation, its cached prefix looked up (and the prompt remembered) and the totals counted."""
    cached = state.cached_prefix(prompt)
    with state.lock:
        state.prompt_tokens_total += len(prompt)
        state.cached_tokens_total += cached
        state.generated_tokens_total += len(ids)
    return Generation(ids, logprobs, finish, cached, started)


def generate(
    state: EngineState,
    prompt: list[int],
    max_new_tokens: int | None,
    *,
    salt: int = 0,
    sampling_seed: int | None = None,
    ignore_eos: bool = False,
    min_new_tokens: int = 0,
) -> Generation:
    started = time.time()
    rng = _rng(state.seed, prompt, salt, sampling_seed)
    natural = rng.randint(max(4, min_new_tokens), max(12, min_new_tokens + 1))
    limit = max_new_tokens if max_new_tokens is not None else 128
    words = [rng.choice(WORDS) for _ in range(min(natural, limit) + 1)]
    ids = [state.tokenizer.piece_id(" " + w) for w in words][: min(natural, limit)]
    ids, finish = _end(ids, natural < limit and not ignore_eos, limit)
    logprobs = [round(-rng.uniform(0.0005, 3.0), 6) for _ in ids]
    return _served(state, prompt, ids, logprobs, finish, started)


def generate_tool_call(
    state: EngineState,
    prompt: list[int],
    tools: list[Any],
    max_new_tokens: int | None,
    *,
    salt: int = 0,
    sampling_seed: int | None = None,
) -> Generation:
    """The emulated model's answer when tools are offered: one Qwen-format call of the first tool, then <|im_end|>
    (deterministic; cut at max_new_tokens like any generation)."""
    started = time.time()
    rng = _rng(state.seed, prompt, salt, sampling_seed)
    limit = max_new_tokens if max_new_tokens is not None else 128
    ids = state.tokenizer.encode(tool_parser.tool_call_text(tools))
    ids, finish = _end(ids, len(ids) < limit, limit)
    logprobs = [round(-rng.uniform(0.0005, 1.0), 6) for _ in ids]
    return _served(state, prompt, ids, logprobs, finish, started)


def meta_info(
    state: EngineState, rid: str, prompt: list[int], gen: Generation, return_logprob: bool, text_in_logprobs: bool
) -> dict[str, Any]:
    """The meta_info dict tokenizer_manager.py builds for a finished request, its keys in sglang's order (the
    differential test, tests/sglang/test_differential.py, compares them with the real engine's): the cache breakdown
    (`cached_tokens_details`, ~l.1924), `dp_rank` (~l.1968; null without data parallelism), then e2e_latency and
    `response_sent_to_client_ts` (~l.1508, set when the finished answer is sent)."""
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
            for lp, tid in zip(gen.logprobs, gen.output_ids, strict=False)
        ]
        meta["output_token_logprobs_length"] = len(gen.output_ids)
    meta.update(
        {
            "reasoning_tokens": 0,
            "completion_tokens": len(gen.output_ids),
            "cached_tokens": gen.cached_tokens,
            # scheduler_components/output_streamer.py `get_cached_tokens_details`: null when nothing was cached
            "cached_tokens_details": {"device": gen.cached_tokens, "host": 0} if gen.cached_tokens > 0 else None,
            "dp_rank": None,
            "e2e_latency": round(time.time() - gen.started, 6),
            "response_sent_to_client_ts": time.time(),
        }
    )
    return meta


def visible_text(state: EngineState, ids: list[int], skip_special: bool = True) -> str:
    """The text of generated ids as the routes return it (special tokens skipped unless asked)."""
    return state.tokenizer.decode(ids, skip_special_tokens=skip_special).lstrip()
