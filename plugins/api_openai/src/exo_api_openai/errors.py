"""OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`, for every failure
under this plugin's routes (see `exo_core.api.dialect.dialect_router`)."""

from __future__ import annotations

from typing import Any

from litestar.exceptions import HTTPException

from exo_api_openai.common import error_body
from exo_core.service import InvalidRequest, ModelNotFound


def api_error(status: int, message: str, exc: Exception) -> dict[str, Any]:
    """The body for a failure; unknown models and routes carry OpenAI's codes for them."""
    code: str | None = None
    if isinstance(exc, ModelNotFound):
        code = "model_not_found"
    elif isinstance(exc, HTTPException) and status == 404:
        code = "not_found"
    param = exc.param if isinstance(exc, InvalidRequest) else None
    return error_body(status, message, code=code, param=param)
