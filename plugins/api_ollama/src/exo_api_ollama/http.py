"""HTTP plumbing for this dialect's routes: body decoding, streams that always close, disconnects.

Kept free of dialect specifics; each dialect plugin carries its own copy (plugins never
import each other).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import anyio
import msgspec
from litestar import Request, route
from litestar.exceptions import MethodNotAllowedException
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import Method, Receive, Scope, Send
from loguru import logger

from exo_core.generation import Chunk, KeepAliveChunk
from exo_core.service import InvalidRequest

T = TypeVar("T")

HTTP_METHODS: tuple[Method, ...] = ("GET", "POST", "PUT", "PATCH", "DELETE")
# nginx's "client closed request": nobody reads it, but logs show what happened.
CLIENT_GONE = 499


def decode_body(body: bytes, type_: type[T]) -> T:
    """Decode a JSON body into `type_`; malformed JSON and wrong types are 400s that say where."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"invalid request body: {e}") from e
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from e


class _ClosingASGIResponse(ASGIResponse):
    def __init__(self, inner: ASGIResponse, generator: AsyncGenerator[bytes, None]) -> None:
        super().__init__()
        self._inner = inner
        self._generator = generator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()


class ClosingStream(Stream):
    """A streamed response that closes its generator however the response ends.

    On a client disconnect Litestar cancels its send loop, which can leave the generator
    suspended at a `yield` until garbage collection; closing it here runs its `finally` (and so
    cancels the generation in the cluster) at once.
    """

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        *,
        media_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers, status_code=200)
        self._generator = content

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        return _ClosingASGIResponse(super().to_asgi_response(*args, **kwargs), self._generator)


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@asynccontextmanager
async def closing(chunks: AsyncIterator[Chunk]) -> AsyncGenerator[AsyncIterator[Chunk], None]:
    """Like `contextlib.aclosing` for the core's chunk iterator (an async generator): leaving
    early closes it, which cancels the generation's task."""
    try:
        yield chunks
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def collect(
    request: Request[Any, Any, Any], chunks: AsyncIterator[Chunk]
) -> list[Chunk] | None:
    """Every chunk of a generation (keep-alives dropped), or None when the client went away
    first; the generation is then closed, which cancels its task."""
    out: list[Chunk] = []
    finished = False
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            # The body is read already, so the next message is the disconnect.
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        async with closing(chunks):
            async for chunk in chunks:
                if not isinstance(chunk, KeepAliveChunk):
                    out.append(chunk)
        finished = True
        tg.cancel_scope.cancel()
    return out if finished else None


def method_guards(routes: Mapping[str, Collection[Method]]) -> list[HTTPRouteHandler]:
    """Handlers that answer a wrong method on a known path with a 405 from this router (so in
    this dialect's error shape) rather than from the app."""
    guards: list[HTTPRouteHandler] = []
    for path, allowed in routes.items():
        others: list[Method] = [m for m in HTTP_METHODS if m not in allowed]

        async def refuse(request: Request[Any, Any, Any]) -> None:
            raise MethodNotAllowedException(
                f"{request.method} is not allowed on {request.url.path}"
            )

        guards.append(route(path, http_method=others, include_in_schema=False)(refuse))
    return guards


class Renderer(Protocol):
    """Turns chunks into wire frames for one streamed response."""

    def start(self) -> list[str]: ...

    def feed(self, chunk: Chunk) -> list[str]: ...

    def fail(self, message: str) -> list[str]: ...


async def frames(renderer: Renderer, chunks: AsyncIterator[Chunk]) -> AsyncGenerator[bytes, None]:
    """The body of a streamed response. Closing it (the client left) closes `chunks`, which
    cancels the generation; a failure after the first byte is reported in-band."""
    async with closing(chunks):
        for frame in renderer.start():
            yield frame.encode()
        try:
            async for chunk in chunks:
                for frame in renderer.feed(chunk):
                    yield frame.encode()
        except Exception as e:
            logger.opt(exception=e).warning("generation failed mid-stream")
            for frame in renderer.fail(f"generation failed: {e!r}"):
                yield frame.encode()
