"""Errors of the native API: JSON `{"status_code": N, "detail": "..."}`."""

from __future__ import annotations

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_422_UNPROCESSABLE_ENTITY


def native_error(status: int, detail: str, extra: object = None) -> Response[dict[str, object]]:
    body: dict[str, object] = {"status_code": status, "detail": detail}
    if extra:
        body["extra"] = extra
    return Response(body, status_code=status)


def on_validation_error(request: Request, exc: ValidationException) -> Response[dict[str, object]]:
    """A body or parameter that does not fit the schema is 422, and says what was wrong."""
    return native_error(HTTP_422_UNPROCESSABLE_ENTITY, exc.detail, exc.extra)


def on_http_error(request: Request, exc: HTTPException) -> Response[dict[str, object]]:
    return native_error(exc.status_code, exc.detail, exc.extra)


def on_not_committed(request: Request, exc: TimeoutError) -> Response[dict[str, object]]:
    """A command that no majority of the cluster took (node.NotCommitted): try again later."""
    return native_error(503, str(exc))
