"""Fault injection (`POST /_emulator/fault`): the broken answers tests need, before a route runs and on its body.

Not sglang: each mode stands for what a broken engine or path could put on the wire; `nan_logprobs` is what the
pinned sglang itself writes for a NaN logprob (docs/polar-verdict.md). Chat completions only.
"""

import asyncio
import json
from typing import Any

import orjson
from fastapi.responses import Response

from polarstack.engine.emulator.engine import EngineState
from polarstack.engine.emulator.errors import error

FAULT_MODES = (
    "none",
    "delay",
    "http500",
    "html",
    "truncated",
    "nan_logprobs",
    "positive_logprobs",
    "length_mismatch",
    "no_extensions",
    "always_extensions",
    "nan_literal_logprobs",
)


async def apply_fault(state: EngineState) -> Response | None:
    """Before the route: wait (`delay`), or answer instead of it (`http500`, `html`); None to go on."""
    mode = state.fault.get("mode", "none")
    if mode == "delay":
        await asyncio.sleep(float(state.fault.get("seconds", 5)))
    elif mode == "http500":
        return error("Internal server error: injected fault", "InternalServerError", 500)
    elif mode == "html":
        return Response("<html><body><h1>502 Bad Gateway</h1></body></html>", status_code=502, media_type="text/html")
    return None


def corrupt(state: EngineState, body: dict[str, Any]) -> Response | None:
    """After the route: the answer with the fault applied to `body` (which it may change), or None to send it as is."""
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
