"""Who may talk to the HTTP API, for every route of every plugin.

A node's API drives the whole cluster (placing and deleting instances included), and the
browser of the person running it is the usual way in for an attacker: any page it opens can
send requests to `http://127.0.0.1:52415`. So, in the order a request meets them:

- **Host allow-list** (middleware): a `Host` header that names some other site is refused. A
  DNS-rebinding page reaches the node under its own domain name; IP literals, localhost names,
  this machine's name, the bind address and `--allowed-host` names are accepted.
- **Origin check** (guard): a request a web page sent (it carries `Origin`) is refused unless
  it comes from the node's own pages or from an origin allowed with `--cors-origin`. This also
  covers the "simple" requests browsers send without a CORS preflight.
- **API key** (guard, optional): with `--api-key` / `EXO_API_KEY`, every route but `/healthz`
  and handlers declared with `opt={"exo_public": True}` needs `Authorization: Bearer <key>` or
  `x-api-key: <key>`.
- **JSON bodies** (guard): a body with a declared media type other than JSON is a 415. Handlers
  that take other bodies list them in `opt={"exo_accepts": ("multipart/form-data",)}`.

Guards raise Litestar HTTP errors, so a dialect's router answers them in its own shape (a 401
from `/v1/messages` is an Anthropic error). CORS is off unless origins are allowed.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
from litestar.config.cors import CORSConfig
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Guard, Receive, Scope, Send

PUBLIC_OPT = "exo_public"
ACCEPTS_OPT = "exo_accepts"
"""A route's `opt` key: the media types its body may have besides JSON
(`opt={ACCEPTS_OPT: ("multipart/form-data",)}`)."""
PUBLIC_PATHS = frozenset({"/healthz"})
LOCAL_NAMES = ("localhost", "localhost.localdomain")
# Request headers a browser page may send cross-origin once its origin is allowed.
CORS_HEADERS = ["Authorization", "Content-Type", "x-api-key", "anthropic-version", "anthropic-beta"]


class UnsupportedMediaType(HTTPException):
    status_code = 415


class HttpPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The API's access settings, from the node's configuration."""

    api_key: str = ""
    cors_origins: tuple[str, ...] = ()
    # Host names accepted besides IP literals, localhost names and this machine's name.
    allowed_hosts: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"


# -- Host ------------------------------------------------------------------------------------


def host_name(header: str) -> str:
    """The name part of a `Host` header: `[::1]:8000` -> `::1`, `Example.COM.:80` -> `example.com`."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def own_names() -> set[str]:
    """This machine's own names: its host name and its mDNS name (`myhost`, `myhost.local`).
    No DNS lookup: that could stall start-up on a network without reverse DNS."""
    name = socket.gethostname().lower().rstrip(".")
    return {name, f"{name}.local"} if name else set()


def host_allowed(header: str, policy: HttpPolicy, machine_names: Iterable[str] = ()) -> bool:
    """Whether a request's `Host` names this node rather than some other site."""
    name = host_name(header)
    if not name:
        return False
    if _is_ip(name) or name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    if name == host_name(policy.bind_host):
        return True
    allowed = {host_name(h) for h in policy.allowed_hosts} | set(machine_names)
    if name in allowed:
        return True
    return any(h.startswith("*.") and name.endswith(h[1:]) for h in allowed)


def host_guard_middleware(policy: HttpPolicy) -> Any:
    """ASGI middleware that answers a request for a foreign `Host` with a 421 before routing."""
    machine = own_names()

    def middleware(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                header = headers.get(b"host", b"").decode("latin-1")
                if not host_allowed(header, policy, machine):
                    await _refusal(header)(scope, receive, send)
                    return
            await app(scope, receive, send)

        return guarded

    return middleware


def _refusal(header: str) -> ASGIResponse:
    """421 Misdirected Request, in the native error shape."""
    detail = (
        f"this node does not answer to the host name '{header[:100]}' "
        "(add it with --allowed-host if it is really this node)"
    )
    body = msgspec.json.encode({"status_code": 421, "detail": detail})
    return ASGIResponse(body=body, status_code=421, media_type="application/json")


# -- guards ----------------------------------------------------------------------------------


def _is_public(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> bool:
    return connection.url.path in PUBLIC_PATHS or bool(handler.opt.get(PUBLIC_OPT))


def origin_allowed(origin: str, host_header: str, policy: HttpPolicy) -> bool:
    """A page's own node, or an origin the operator allowed."""
    if origin in policy.cors_origins or "*" in policy.cors_origins:
        return True
    netloc = urlsplit(origin).netloc.lower()
    return bool(netloc) and netloc == host_header.strip().lower()


def origin_guard(policy: HttpPolicy) -> Guard:
    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        origin = connection.headers.get("origin")
        if origin is None:
            return  # not sent by a web page
        if not origin_allowed(origin, connection.headers.get("host", ""), policy):
            raise PermissionDeniedException(
                f"requests from web pages at {origin[:100]} are not allowed "
                "(allow the origin with --cors-origin)"
            )

    return guard


def presented_key(headers: Any) -> str | None:
    """The key a client sent: `Authorization: Bearer <key>` (OpenAI, Ollama clients) or
    `x-api-key: <key>` (Anthropic clients)."""
    auth: str = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key: str | None = headers.get("x-api-key")
    return key.strip() if key else None


def api_key_guard(key: str) -> Guard:
    expected = key.encode()

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if _is_public(connection, handler):
            return
        given = presented_key(connection.headers)
        if given is None:
            raise NotAuthorizedException(
                "this node needs an API key: send 'Authorization: Bearer <key>' or 'x-api-key'"
            )
        if not hmac.compare_digest(given.encode(), expected):
            raise NotAuthorizedException("the API key is not valid")

    return guard


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def json_body_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """A body declared as something other than JSON is a 415 (no declared type is read as
    JSON, as curl and scripts often send none)."""
    content_type = connection.headers.get("content-type")
    if not content_type or is_json(content_type):
        return
    accepted: Sequence[str] = handler.opt.get(ACCEPTS_OPT, ())
    media = content_type.split(";", 1)[0].strip().lower()
    if media in accepted:
        return
    if connection.scope.get("method", "GET") in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return  # no body is read
    raise UnsupportedMediaType(
        f"the request body must be JSON (Content-Type: application/json), not '{media[:100]}'"
    )


def guards(policy: HttpPolicy) -> list[Guard]:
    out: list[Guard] = [origin_guard(policy), json_body_guard]
    if policy.api_key:
        out.append(api_key_guard(policy.api_key))
    return out


def cors_config(policy: HttpPolicy) -> CORSConfig | None:
    """CORS for the allowed origins only; None (no CORS headers at all) by default."""
    if not policy.cors_origins:
        return None
    return CORSConfig(
        allow_origins=list(policy.cors_origins),
        allow_headers=CORS_HEADERS,
        allow_methods=["*"],
    )
