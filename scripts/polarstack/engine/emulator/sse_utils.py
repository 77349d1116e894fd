"""The streamed chat chunks as sglang/srt/entrypoints/openai/sse_utils.py builds them (`build_sse_content`).

sglang writes role, content and finish chunks with msgspec structs, not its pydantic models: `StreamDelta` always
carries `reasoning_content` (first) and omits role/content when unset and has no tool_calls key, `StreamChoice`
writes every key, and `StreamChunk` omits `usage` when unset; compact JSON, UTF-8 unescaped. The differential test
(tests/sglang/test_differential.py) compares these chunks with the real engine's.
"""

import json
from typing import Any


def build_sse_content(
    chunk_id: str,
    created: int,
    model: str,
    index: int,
    role: str | None = None,
    content: str | None = None,
    reasoning_content: str | None = None,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    matched_stop: int | str | None = None,
    usage: dict[str, Any] | None = None,
) -> str:
    delta: dict[str, Any] = {"reasoning_content": reasoning_content}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "matched_stop": matched_stop,
    }
    chunk: dict[str, Any] = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage is not None:
        chunk["usage"] = usage
    return "data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False) + "\n\n"
