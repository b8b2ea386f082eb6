"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every failure
under this plugin's routes (the core's refusals, Litestar's own 404/405/413s, bugs)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from loguru import logger

from exo_api_claude.translate import error_body
from exo_core.service import GenerationError


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
