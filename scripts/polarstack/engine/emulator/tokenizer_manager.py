"""The length checks of sglang/srt/managers/tokenizer_manager.py (`_validate_one_request`, ~l.948-997 at
SGLANG_VERSION; the wheel polarstack.engine.protocol unpacks).

A request whose prompt reaches the model's context length, or whose prompt plus `max_new_tokens` exceeds it, is
refused before generation with a ValueError, which the OpenAI routes answer with HTTP 400, type BadRequestError
(entrypoints/openai/serving_base.py `handle_request`), for streamed requests too (the error comes before the first
event). The sentences are sglang's own (configs/upstream/real-sglang-cpu.json records them from the pinned wheel,
and the differential test compares them with the real engine's answers). Without speculative decoding
`num_reserved_tokens` is 0 and `--allow-auto-truncate` is off, as on the stack's engines (issue 18 point 2: with
it sglang would clamp instead). `upstream_problems()` lets `make verify-offline` confirm the pinned wheel still
says this.
"""

from __future__ import annotations

from polarstack.engine.emulator.engine import CONTEXT_LENGTH

TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
# Statements of the pinned source the check mirrors (verified by upstream_problems).
UPSTREAM_STATEMENTS = (
    "if input_token_num >= self.context_len:",
    "and (max_new_tokens + input_token_num) > _max_req_len",
    'f"Requested token count exceeds the model\'s maximum context length "',
    'f"of {self.context_len} tokens. You requested a total of {total_tokens} "',
)


def length_problem(prompt_tokens: int, max_new_tokens: int | None, context_length: int = CONTEXT_LENGTH) -> str | None:
    """The ValueError message sglang raises for this request, or None when it fits."""
    if prompt_tokens >= context_length:
        return (
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if max_new_tokens is not None and max_new_tokens + prompt_tokens > context_length:
        return (
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {max_new_tokens + prompt_tokens} tokens: {prompt_tokens} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit."
        )
    return None


def upstream_problems(source: str) -> list[str]:
    """Statements of the check missing from the pinned tokenizer_manager.py source."""
    return [
        f"the pinned sglang's {TOKENIZER_MANAGER} no longer contains {statement!r}; re-read its total-token check"
        for statement in UPSTREAM_STATEMENTS
        if statement not in source
    ]
