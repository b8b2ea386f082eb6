"""Hook implementations of the api_ollama plugin."""

from __future__ import annotations

from typing import Any

from exo_api_ollama.routes import router
from exo_core.plugin import hookimpl


@hookimpl
def exo_routes() -> list[Any]:
    return [router()]
