"""sglang's total-token check (issue 18 point 2): input + max_new_tokens must fit the engine's context.

Mirrors the pinned sglang's (SGLANG_VERSION) `srt/managers/tokenizer_manager.py` `TokenizerManager._validate_one_request`
(~l.948-997; the wheel polarstack.engine.protocol unpacks): an input of context_len tokens or more is refused
("The input (N tokens) is longer than the model's context length (C tokens)."), then, when max_new_tokens is set,
`(max_new_tokens + input_token_num) > context_len` is refused with "Requested token count exceeds the model's
maximum context length ..." (both raise ValueError, which serving_chat.py turns into a 400 ErrorResponse through
serving_base.py `create_error_response`, type "BadRequestError"). `--allow-auto-truncate` would clamp instead; the
stack's engines run without it. `upstream_problems()` lets `make verify-offline` confirm the pinned wheel still
says this.
"""

from __future__ import annotations

TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
# Statements of the pinned source the check mirrors (verified by upstream_problems).
UPSTREAM_STATEMENTS = (
    "if input_token_num >= self.context_len:",
    "and (max_new_tokens + input_token_num) > _max_req_len",
    'f"Requested token count exceeds the model\'s maximum context length "',
    'f"of {self.context_len} tokens. You requested a total of {total_tokens} "',
)


def total_token_error(input_tokens: int, max_new_tokens: int | None, context_len: int) -> str | None:
    """sglang's refusal message for this request, or None when it fits."""
    if input_tokens >= context_len:
        return f"The input ({input_tokens} tokens) is longer than the model's context length ({context_len} tokens)."
    if max_new_tokens is not None and max_new_tokens + input_tokens > context_len:
        total = max_new_tokens + input_tokens
        return (
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {total} tokens: {input_tokens} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )
    return None


def upstream_problems(source: str) -> list[str]:
    """Statements of the check missing from the pinned tokenizer_manager.py source."""
    return [
        f"the pinned sglang's {TOKENIZER_MANAGER} no longer contains {statement!r}; re-read its total-token check"
        for statement in UPSTREAM_STATEMENTS
        if statement not in source
    ]


__all__ = ["TOKENIZER_MANAGER", "total_token_error", "upstream_problems"]
