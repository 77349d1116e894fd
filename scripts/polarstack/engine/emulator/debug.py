"""The emulator's own routes under `/_emulator/`: the request log, token totals, the served log and fault injection.

Not sglang (sglang never serves this prefix): tests use the request log to prove what reached the engine, a
workload uses `/_emulator/served` (one compact line per chat completion with its token counts and the first
characters of its last message) to tell which engine served which turn.
"""

from fastapi import FastAPI, Request

from polarstack.engine.emulator.engine import REQUEST_LOG_SIZE, EngineState
from polarstack.engine.emulator.errors import error
from polarstack.engine.emulator.faults import FAULT_MODES


def add_routes(app: FastAPI, state: EngineState) -> None:

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
        return {
            "prompt_tokens": state.prompt_tokens_total,
            "cached_tokens": state.cached_tokens_total,
            "generated_tokens": state.generated_tokens_total,
            "served": state.served,
            "chat_completions": state.chat_completions,
        }

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
