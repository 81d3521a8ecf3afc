"""Errors as OpenAI error bodies: ``{"error": {"message", "type", "param", "code"}}``.

`InvalidGrammarError` (admission, or a compile that failed before the first token)
      -> 400 ``invalid_request_error``; ``param`` is the error's `part` (the field or schema
      location), ``code`` its class in snake case (``invalid_grammar``,
      ``unsatisfiable_grammar``, ``grammar_compile_timeout``, ...); the message names the
      unsupported `feature` when there is one.
request validation (pydantic) -> 400 ``invalid_request_error`` with the field's location as ``param``.
`RequestError` -> its own status (400 for out-of-range values, 404 for an unknown model, 413 for
      a body or prompt past its bound, 503 while the engine process is down: `EngineUnavailable`).
anything else -> 500 ``server_error`` (logged with its traceback).
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fd_guided.errors import InvalidGrammarError
from fd_guided.harness.server.protocol import ErrorBody, ErrorResponse

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the server refuses for a reason other than its constraint."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None, type: str = "invalid_request_error"
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


class EngineUnavailable(RequestError):
    """The engine process is down (it died, or is starting again): HTTP 503, or an SSE error event
    once a stream has begun."""

    def __init__(self, message: str = "the engine process is not running; retry shortly"):
        super().__init__(message, status=503, code="engine_unavailable", type="server_error")

    def body(self) -> dict:
        return ErrorResponse(
            error=ErrorBody(message=self.message, type=self.type, param=None, code=self.code)
        ).model_dump()


def grammar_error_fields(error: InvalidGrammarError) -> dict:
    """``message``, ``param`` and ``code`` of a constraint refusal (the engine process sends them as they are)."""
    message = str(error)
    if error.feature and error.feature not in message:
        message = f"{message} (unsupported: {error.feature})"
    return {"message": message, "param": error.part, "code": _snake(type(error).__name__)}


def grammar_error_response(error: InvalidGrammarError) -> JSONResponse:
    return error_response(400, **grammar_error_fields(error))


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().removesuffix("_error")


def _location(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text or "body"


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidGrammarError)
    async def _grammar(request: Request, error: InvalidGrammarError):
        return grammar_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {"loc": (), "msg": str(error)}
        param = _location(first.get("loc", ()))
        message = f"{param}: {first.get('msg')}"
        if first.get("type") == "extra_forbidden":
            message = f"{param}: unknown parameter"
        return error_response(400, message, param=param, code=first.get("type"))

    @app.exception_handler(RequestError)
    async def _request(request: Request, error: RequestError):
        return error_response(error.status, error.message, param=error.param, code=error.code, type=error.type)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception):
        logger.exception("unexpected error serving %s", request.url.path)
        return error_response(500, f"internal error: {type(error).__name__}: {error}", type="server_error")
