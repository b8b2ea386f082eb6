"""Hook implementations of the dashboard plugin: the page at `/` and its files under `/static/`.

The page and its files carry no cluster data, so they are public (`exo_public`): the page loads
without the API key, then asks for it when the API answers 401.
"""

from __future__ import annotations

from typing import Any

from exo_core.plugin import hookimpl
from exo_dashboard.routes import routes


@hookimpl
def exo_routes() -> list[Any]:
    return routes()
