"""The Litestar app factory. No global state: everything hangs off the node passed in."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig

from exo_core.api.errors import on_http_error, on_validation_error
from exo_core.api.native import NativeController
from exo_core.api.security import HttpPolicy, cors_config, guards, host_guard_middleware
from exo_core.node import Node


def http_policy(node: Node) -> HttpPolicy:
    config = node.config
    return HttpPolicy(
        api_key=config.api_key,
        cors_origins=tuple(config.cors_origins),
        allowed_hosts=tuple(config.allowed_hosts),
        bind_host=config.api_host,
    )


def create_app(node: Node) -> Litestar:
    service = node.generation
    policy = http_policy(node)
    contributed: list[Any] = []
    for handlers in node.plugins.hook.exo_routes(ctx=node):
        contributed.extend(handlers or [])
    return Litestar(
        route_handlers=[NativeController, *contributed],
        dependencies={
            "node": Provide(lambda: node, sync_to_thread=False),
            "generation": Provide(lambda: service, sync_to_thread=False),
        },
        exception_handlers={
            ValidationException: on_validation_error,
            HTTPException: on_http_error,
        },
        cors_config=cors_config(policy),
        guards=guards(policy),
        middleware=[host_guard_middleware(policy)],
        openapi_config=OpenAPIConfig(title="exo", version="0.1.0", path="/schema"),
        debug=False,
    )
