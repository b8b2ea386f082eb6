"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every failure
under this plugin's routes (the core's refusals, Litestar's own 404/405/413s, bugs)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from loguru import logger

from exo_core.service import GenerationError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, message: str) -> Response[Any]:
    return Response(error_body(status, message), status_code=status)


def _on_generation_error(_: Request[Any, Any, Any], exc: GenerationError) -> Response[Any]:
    return error_response(exc.status, exc.message)


def _on_http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return error_response(exc.status_code, exc.detail)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    logger.opt(exception=exc).error(f"{request.method} {request.url.path} failed")
    return error_response(500, f"internal error: {exc!r}")


# ValidationException is listed itself: the app maps it to the native shape, and a handler for
# the exact class would win over ours for its base class.
EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    GenerationError: _on_generation_error,
    ValidationException: _on_http_error,
    HTTPException: _on_http_error,
    Exception: _on_unexpected,
}
