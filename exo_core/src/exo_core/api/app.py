"""The Litestar app factory. No global state: everything hangs off the node passed in."""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig

from exo_core.api.errors import on_http_error, on_validation_error
from exo_core.api.native import NativeController
from exo_core.metrics import metrics_middleware
from exo_core.node import Node


def create_app(node: Node) -> Litestar:
    service = node.generation
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
        middleware=[metrics_middleware(node.metrics)],
        cors_config=CORSConfig(allow_origins=["*"]),
        openapi_config=OpenAPIConfig(title="exo", version="0.1.0", path="/schema"),
        debug=False,
    )
