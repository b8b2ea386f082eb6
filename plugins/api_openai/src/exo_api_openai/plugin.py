"""Hook implementations of the api_openai plugin."""

from __future__ import annotations

from typing import Any

from exo_api_openai.routes import router, stored_images_router
from exo_core.hookspecs import hookimpl


@hookimpl
def exo_routes() -> list[Any]:
    return [router(), stored_images_router()]
