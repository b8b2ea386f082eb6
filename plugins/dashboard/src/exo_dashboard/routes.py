"""The dashboard's routes: `GET /` (the page) and `GET /static/{file}` (its CSS, JS, icon)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Response, get
from litestar.datastructures import CacheControlHeader
from litestar.static_files import create_static_files_router

STATIC_DIR = Path(__file__).parent / "static"
PUBLIC = {"exo_public": True}

# The page talks to its own node only and never runs model output as code: scripts, styles,
# fonts and requests are limited to this origin; images may also be data:/blob: URLs (the
# image generations arrive as base64).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@get("/", opt=PUBLIC, include_in_schema=False, sync_to_thread=False)
def index() -> Response[bytes]:
    # Read per request (a few kB): edits to the page show on reload, with no restart.
    page = (STATIC_DIR / "index.html").read_bytes()
    return Response(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


def routes() -> list[Any]:
    static = create_static_files_router(
        path="/static",
        directories=[STATIC_DIR],
        name="dashboard-static",
        opt=PUBLIC,
        # Revalidated on every load, so an upgraded node never serves a stale mix of modules.
        cache_control=CacheControlHeader(no_cache=True),
        include_in_schema=False,
    )
    return [index, static]
