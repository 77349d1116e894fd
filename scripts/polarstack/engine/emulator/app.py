"""The emulator's app factory (`create_app`) and `serve()`: one FastAPI app with the request log and every router.

Mirrors how sglang/srt/entrypoints/http_server.py assembles its app (the `validation_exception_handler`, the
native routes, the OpenAI serving routes); the `/_emulator/` routes are the emulator's own.
"""

from polarstack.engine import protocol as sglang_protocol
from polarstack.engine.emulator import debug, errors, http_server, serving_chat, serving_completions, serving_tokenize
from polarstack.engine.emulator.engine import DEFAULT_MODEL, EngineState
from polarstack.engine.emulator.request_log import RequestLog


def create_app(state: EngineState):
    """A FastAPI app serving `state` as one sglang engine (routes in the modules of this package)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="polarstack sglang emulator", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RequestLog, state=state)
    app.add_exception_handler(RequestValidationError, errors.validation_error)
    # Routes are added to the app itself (not included APIRouters), so app.routes lists every route flat.
    for module in (http_server, debug, serving_chat, serving_completions, serving_tokenize):
        module.add_routes(app, state)
    return app


def serve(
    port: int,
    host: str = "127.0.0.1",
    model: str = DEFAULT_MODEL,
    seed: int = 0,
    tool_call_parser: str | None = None,
    prefill_us_per_token: float = 0.0,
    decode_us_per_token: float = 0.0,
) -> None:
    """Run the emulator in the foreground until interrupted."""
    import uvicorn

    state = EngineState(
        model=model,
        seed=seed,
        port=port,
        tool_call_parser=tool_call_parser,
        prefill_us_per_token=prefill_us_per_token,
        decode_us_per_token=decode_us_per_token,
    )
    app = create_app(state)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    print(
        f"polarstack: sglang {sglang_protocol.sglang_version()} emulator serving {model} on http://{host}:{port}",
        flush=True,
    )
    server.run()
