"""Errors of the native API: JSON `{"status_code": N, "detail": "..."}`; a 5xx also names its
`request_id` (logged with its traceback, see `exo_core.api.request_ids`)."""

from __future__ import annotations

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_422_UNPROCESSABLE_ENTITY

from exo_core.api.request_ids import log_server_error

# The detail of a 500 for a bug: what failed is in the node's log, not in the answer.
INTERNAL_ERROR = "the node failed to handle this request (see its log for details)"


def native_error(
    status: int, detail: str, extra: object = None, request_id: str | None = None
) -> Response[dict[str, object]]:
    """An error response in the native API's shape: `{"status_code", "detail"}`, with
    `extra` and the request id when given."""
    body: dict[str, object] = {"status_code": status, "detail": detail}
    if extra:
        body["extra"] = extra
    if request_id:
        body["request_id"] = request_id
    return Response(body, status_code=status)


def on_validation_error(request: Request, exc: ValidationException) -> Response[dict[str, object]]:
    """A body or parameter that does not fit the schema is 422, and says what was wrong."""
    return native_error(HTTP_422_UNPROCESSABLE_ENTITY, exc.detail, exc.extra)


def on_http_error(request: Request, exc: HTTPException) -> Response[dict[str, object]]:
    rid = log_server_error(request.scope, exc.status_code, exc) if exc.status_code >= 500 else None
    return native_error(exc.status_code, exc.detail, exc.extra, rid)


def on_unexpected(request: Request, exc: Exception) -> Response[dict[str, object]]:
    """A bug: a 500 whose traceback is in the log under the request id the caller gets."""
    return native_error(500, INTERNAL_ERROR, request_id=log_server_error(request.scope, 500, exc))


def on_not_committed(request: Request, exc: TimeoutError) -> Response[dict[str, object]]:
    """A command that no majority of the cluster took (node.NotCommitted): try again later."""
    return native_error(503, str(exc))
