"""sglang's error answers: the ErrorResponse body, the 400 for invalid requests, the JSON content-type check.

Mirrors sglang/srt/entrypoints/http_server.py (`validation_exception_handler`, `validate_json_request`), answering
with sglang's own ErrorResponse model (entrypoints/openai/protocol.py, loaded by polarstack.engine.protocol).
"""

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from polarstack.engine import protocol as sglang_protocol


def error(message: str, err_type: str = "BadRequest", status: int = 400) -> JSONResponse:
    """sglang's ErrorResponse as a JSON answer with `status`."""
    body = sglang_protocol.protocol().ErrorResponse(message=message, type=err_type, code=status).model_dump()
    return JSONResponse(body, status_code=status)


async def validation_error(request: Request, exc: RequestValidationError):
    # http_server.py validation_exception_handler: 400 with the legacy ErrorResponse shape.
    exc_str, errors_str = str(exc), str(exc.errors())
    message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
    return error(message, "Bad Request", 400)


async def validate_json_request(raw_request: Request):
    """http_server.py validate_json_request: OpenAI routes accept only `Content-Type: application/json`."""
    media_type = raw_request.headers.get("content-type", "").lower().split(";", 1)[0]
    if media_type != "application/json":
        raise RequestValidationError(
            errors=[
                {  # the keys in sglang's order (the differential test compares the message text)
                    "loc": ["header", "content-type"],
                    "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                    "type": "value_error",
                }
            ]
        )
