"""The Litestar app factory. No global state: everything hangs off the node passed in."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig

from exo_core.api.errors import on_http_error, on_not_committed, on_unexpected, on_validation_error
from exo_core.api.request_ids import send_request_id
from exo_core.api.routes_check import CORE_CONTROLLERS, accepted_routes
from exo_core.api.security import HttpPolicy, cors_config, guards, host_guard_middleware
from exo_core.metrics import metrics_middleware
from exo_core.node import Node, NotCommitted


def http_policy(node: Node) -> HttpPolicy:
    config = node.config
    return HttpPolicy(
        api_key=config.api_key,
        cors_origins=tuple(config.cors_origins),
        allowed_hosts=tuple(config.allowed_hosts),
        bind_host=config.api_host,
    )


def create_app(node: Node) -> Litestar:
    contributed = [
        (name, list(handlers))
        for name, handlers in node.plugins.collect("exo_routes", ctx=node.context)
    ]
    try:
        return _app(node, [*CORE_CONTROLLERS, *(h for _, hs in contributed for h in hs)])
    except Exception:
        pass
    # A plugin's handlers are refused, or two serve one route: find out which (routes_check).
    mine = accepted_routes(node.plugins, contributed, lambda handlers: _app(node, handlers))
    return _app(node, [*CORE_CONTROLLERS, *mine])


def _app(node: Node, handlers: list[Any]) -> Litestar:
    service = node.generation
    policy = http_policy(node)
    return Litestar(
        route_handlers=handlers,
        dependencies={
            "node": Provide(lambda: node, sync_to_thread=False),
            "generation": Provide(lambda: service, sync_to_thread=False),
        },
        exception_handlers={
            ValidationException: on_validation_error,
            HTTPException: on_http_error,
            NotCommitted: on_not_committed,
            Exception: on_unexpected,
        },
        before_send=[send_request_id],
        cors_config=cors_config(policy),
        guards=guards(policy),
        middleware=[metrics_middleware(node.metrics), host_guard_middleware(policy)],
        openapi_config=OpenAPIConfig(title="exo", version="0.1.0", path="/schema"),
        debug=False,
    )
