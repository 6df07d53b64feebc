"""Errors in OpenAI's shape, ``{"error": {"message", "type", "code"}}``, for both of summrl's OpenAI-compatible servers
(``summrl.serve`` and the embedded backend's endpoint). OpenAI's clients read the message and type from it; FastAPI's
own shape (``{"detail": ...}``, 422 for a bad field) is not what they expect of an OpenAI endpoint."""

from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# OpenAI's error types, by status: its clients read the error's message and type.
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error", 503: "server_error"}

BAD_REQUEST = "bad request: "  # the start of every refused field's message


def error_response(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
    """One error in OpenAI's shape."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                        headers=headers)


def openai_errors(app: FastAPI) -> None:
    """``app``'s refusals in OpenAI's shape: a field that fails validation is a 400 naming it (FastAPI's 422 listed
    it in its own shape), and every HTTPException, FastAPI's own and the router's (404, 405), keeps its status."""

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                             for e in error.errors())
        return error_response(400, f"{BAD_REQUEST}{problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), error.headers)
