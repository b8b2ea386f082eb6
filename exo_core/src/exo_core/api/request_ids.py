"""Every response carries a request id, and every 5xx is logged with it and its traceback.

A client that got a 5xx can quote the id (the `x-request-id` header of every response, and
`request-id`, where Anthropic's clients look; a 5xx's JSON body has it as `request_id`), and the operator
finds the request, its route and the traceback in the node's log under the same id.
"""

from __future__ import annotations

import secrets
from typing import Any

from litestar.types import Message, Scope
from loguru import logger

from exo_core.plugin_host import describe

STATE_KEY = "exo_request_id"
HEADERS = (b"x-request-id", b"request-id")


def request_id(scope: Scope | dict[str, Any]) -> str:
    """The id of the request of `scope`, made on first use."""
    state: dict[str, Any] = scope.setdefault("state", {})  # type: ignore[arg-type, assignment]
    found = state.get(STATE_KEY)
    if not isinstance(found, str):
        found = state[STATE_KEY] = f"req_{secrets.token_hex(8)}"
    return found


async def send_request_id(message: Message, scope: Scope) -> None:
    """An app `before_send` hook: the request id as a header of every response. A route that
    names its own (a dialect's generation id, which cancels it) keeps it, under both names."""
    if message["type"] == "http.response.start":
        headers = list(message.get("headers") or [])
        present = {bytes(name).lower(): bytes(value) for name, value in headers}
        rid = next((present[n] for n in HEADERS if n in present), None)
        if rid is None:
            rid = request_id(scope).encode()
        headers.extend((name, rid) for name in HEADERS if name not in present)
        message["headers"] = headers


def log_server_error(scope: Scope, status: int, exc: BaseException) -> str:
    """Log a 5xx with its request id, route and traceback; return the id."""
    rid = request_id(scope)
    route = f"{scope.get('method', '?')} {scope.get('path', '?')}"
    logger.opt(exception=exc).error(f"request {rid}: {route} answered {status}: {describe(exc)}")
    return rid


__all__ = ["log_server_error", "request_id", "send_request_id"]
