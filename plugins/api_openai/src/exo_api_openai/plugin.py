"""Hook implementations of the api_openai plugin."""

from __future__ import annotations

from typing import Any

from exo_api_openai import bench
from exo_api_openai.routes import router, stored_images_router
from exo_core.plugin import hookimpl


@hookimpl
def exo_routes() -> list[Any]:
    # Clients that reach exo through an Ollama base URL (Open WebUI, VS Code Copilot) speak
    # OpenAI's API under it too.
    return [router(), router("/ollama/v1"), stored_images_router(), bench.router()]
