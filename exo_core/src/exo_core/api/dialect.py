"""HTTP plumbing for API dialect plugins (OpenAI, Anthropic, Ollama, or a third party's).

A dialect plugin translates its wire format to `GenerationParams`, asks the node's
`GenerationService` for chunks and renders them back. What is the same for every dialect lives
here, so each plugin keeps only its translation and its error shape:

- `dialect_router` mounts the handlers under a path and answers every failure below it (the
  core's refusals, unknown paths, wrong methods, bugs) in the dialect's error shape.
- `decode_body` reads a JSON body into a msgspec type, with 400s that say what is wrong;
  `documented_body` puts that type in the OpenAPI schema.
- `sse` / `ndjson` stream rendered chunks; the generation is cancelled as soon as the client
  leaves, and a failure after the first byte is reported in-band by the renderer.
- `answer` collects a non-streamed generation, cancelling it if the client leaves first.

A route typically reads::

    @post("/chat", status_code=200, dependencies=documented_body(ChatRequest))
    async def chat(request: Request, generation: GenerationService) -> Response[Any]:
        req = decode_body(await request.body(), ChatRequest)
        params = to_params(req, generation.resolve(req.model))
        chunks = await generation.generate(req.model, params, MY_FIELD_NAMES)
        if req.stream:
            return sse(ChatStream(req.model), chunks)
        return await answer(request, chunks, lambda collected: completion(req.model, collected))

    def router() -> Router:
        return dialect_router("/v1", [chat], error_body=my_error_body, tags=["mine"])
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol, TypeVar

import anyio
import msgspec
from litestar import Request, Response, Router, route
from litestar.di import Provide
from litestar.enums import RequestEncodingType
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.handlers import HTTPRouteHandler
from litestar.params import Body, FromPath
from litestar.response import Stream
from litestar.response.base import ASGIResponse
from litestar.types import ExceptionHandlersMap, Method, Receive, Scope, Send
from loguru import logger

from exo_core.api.errors import INTERNAL_ERROR
from exo_core.api.request_ids import log_server_error
from exo_core.generation import Chunk, FinishChunk, FinishReason, KeepAliveChunk
from exo_core.redact import public_message
from exo_core.service import GenerationError, InvalidRequest

__all__ = [
    "CLIENT_GONE",
    "HTTP_METHODS",
    "INTERNAL_ERROR",
    "NDJSON_MEDIA_TYPE",
    "SSE_HEADERS",
    "SSE_MEDIA_TYPE",
    "UNFINISHED",
    "AnyRequest",
    "ClosingStream",
    "ErrorBody",
    "GenerationFailed",
    "Renderer",
    "answer",
    "answered",
    "closing",
    "collect",
    "decode_body",
    "dialect_router",
    "documented_body",
    "exception_handlers",
    "finish_failure",
    "frames",
    "method_guards",
    "ndjson",
    "sse",
]

T = TypeVar("T")
AnyRequest = Request[Any, Any, Any]
"""A Litestar request of any kind, for route handlers that read it themselves."""

# The methods a dialect answers for (HEAD and OPTIONS are left to Litestar and CORS).
HTTP_METHODS: tuple[Method, ...] = ("GET", "POST", "PUT", "PATCH", "DELETE")
# nginx's "client closed request": nobody reads it, but logs show what happened.
CLIENT_GONE = 499
SSE_MEDIA_TYPE = "text/event-stream"
# Proxies must neither cache nor buffer a stream of events.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
NDJSON_MEDIA_TYPE = "application/x-ndjson"
"""The media type of newline-delimited JSON streams."""


# -- errors ------------------------------------------------------------------------------------


class GenerationFailed(GenerationError):
    """A generation that ended without an answer (cancelled in the cluster, failed in its
    engine). Raise it while building a non-streamed answer: the dialect's exception handlers
    turn it into a 500 in the dialect's error shape."""

    status = 500


ErrorBody = Callable[[int, str, Exception], Any]
"""A dialect's error shape: `(status, message, exception)` -> the JSON body to send. The
exception is what was raised (a `GenerationError`, a Litestar `HTTPException`, or a bug), for
dialects whose errors carry a code."""


UNFINISHED = "the generation ended without finishing"
"""Why a collected generation has no finish chunk (its stream ended early)."""


def finish_failure(reason: FinishReason) -> str | None:
    """The error message for a finish that gives no answer (cancelled, failed), else None."""
    if reason == FinishReason.CANCELLED:
        return "the generation was cancelled in the cluster"
    if reason == FinishReason.ERROR:
        return "the generation failed"
    return None


def answered(finish: FinishChunk | None) -> FinishChunk:
    """The finish chunk of a generation that gave an answer. Raises `GenerationFailed` for one
    that did not finish, or finished cancelled or failed."""
    if finish is None:
        raise GenerationFailed(UNFINISHED)
    problem = finish_failure(finish.finish_reason)
    if problem is not None:
        raise GenerationFailed(problem)
    return finish


def exception_handlers(error_body: ErrorBody) -> ExceptionHandlersMap:
    """Handlers that answer every exception in the dialect's error shape: the core's
    `GenerationError`s with their status, Litestar's HTTP errors (404, 405, 413, validation)
    with theirs, and anything else as a logged 500."""

    def respond(request: AnyRequest, status: int, message: str, exc: Exception) -> Response[Any]:
        body = error_body(status, message, exc)
        if status >= 500:  # logged with its traceback, under the id the caller is given
            rid = log_server_error(request.scope, status, exc)
            if isinstance(body, dict):  # beside the dialect's own fields, as Anthropic's API has it
                body = {**body, "request_id": rid}
        return Response(body, status_code=status)

    def on_generation_error(request: AnyRequest, exc: GenerationError) -> Response[Any]:
        return respond(request, exc.status, exc.message, exc)

    def on_http_error(request: AnyRequest, exc: HTTPException) -> Response[Any]:
        return respond(request, exc.status_code, exc.detail, exc)

    def on_unexpected(request: AnyRequest, exc: Exception) -> Response[Any]:
        # A bug: the trace goes to the log, the caller learns only that the node failed.
        return respond(request, 500, INTERNAL_ERROR, exc)

    # ValidationException is listed itself: the app maps it to the native shape, and a handler
    # for the exact class would win over ours for its base class.
    return {
        GenerationError: on_generation_error,
        ValidationException: on_http_error,
        HTTPException: on_http_error,
        Exception: on_unexpected,
    }


# -- requests ----------------------------------------------------------------------------------


def decode_body(body: bytes, type_: type[T]) -> T:
    """Decode a JSON body into `type_`; malformed JSON and wrong types are 400s that say where.

    Decoding by hand (rather than through a `data` parameter) keeps Litestar's own validation,
    and its native-shaped 400s, out of the dialect's routes."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"invalid request body: {e}") from e
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from e


def documented_body(
    type_: type[Any], media_type: RequestEncodingType | None = None
) -> dict[str, Provide]:
    """Route dependencies that make the OpenAPI schema document `type_` as the route's body
    (JSON, or `media_type` such as a multipart form), for a handler that reads its body itself
    with `decode_body`::

        @post("/chat", dependencies=documented_body(ChatRequest))

    Litestar documents the `data` parameter of a route's dependencies as its body; this one is
    never called (the handler does not ask for it), so the body is still decoded only once."""

    def body_schema(data: Any) -> None:  # pragma: no cover - never called
        return None

    annotation: Any = type_ if media_type is None else Annotated[type_, Body(media_type=media_type)]
    body_schema.__annotations__ = {"data": annotation, "return": None}
    return {"documented_body": Provide(body_schema, sync_to_thread=False)}


# -- streamed responses ------------------------------------------------------------------------


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


class Renderer(Protocol):
    """Turns chunks into wire frames (text) for one streamed response."""

    def start(self) -> list[str]:
        """Frames sent before the first chunk (a header event), often none."""
        ...

    def feed(self, chunk: Chunk) -> list[str]:
        """Frames for one chunk, keep-alives included (a dialect's ping or empty line)."""
        ...

    def fail(self, message: str) -> list[str]:
        """Frames that report an error once the response has begun (its status is sent)."""
        ...


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
            for frame in renderer.fail(f"generation failed: {public_message(e)}"):
                yield frame.encode()


def sse(
    renderer: Renderer, chunks: AsyncIterator[Chunk], headers: dict[str, str] | None = None
) -> ClosingStream:
    """A server-sent-events response of `renderer`'s frames (each a whole `data:` event)."""
    return ClosingStream(
        frames(renderer, chunks),
        media_type=SSE_MEDIA_TYPE,
        headers={**SSE_HEADERS, **(headers or {})},
    )


def ndjson(renderer: Renderer, chunks: AsyncIterator[Chunk]) -> ClosingStream:
    """A newline-delimited JSON response of `renderer`'s frames (each a line)."""
    return ClosingStream(frames(renderer, chunks), media_type=NDJSON_MEDIA_TYPE)


# -- non-streamed responses --------------------------------------------------------------------


async def collect(request: AnyRequest, chunks: AsyncIterator[Chunk]) -> list[Chunk] | None:
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


async def answer(
    request: AnyRequest, chunks: AsyncIterator[Chunk], build: Callable[[list[Chunk]], Any]
) -> Response[Any]:
    """A non-streamed response: `build` turns the collected chunks into the JSON body (and
    raises `GenerationFailed` for a generation that gave no answer). A client that leaves
    first cancels the generation and gets `CLIENT_GONE` (which it never reads)."""
    collected = await collect(request, chunks)
    if collected is None:
        return Response(None, status_code=CLIENT_GONE)
    return Response(build(collected))


# -- routing -----------------------------------------------------------------------------------


def method_guards(handlers: Sequence[HTTPRouteHandler]) -> list[HTTPRouteHandler]:
    """Handlers that answer a wrong method on a path of `handlers` with a 405 from the
    dialect's router (so in its error shape) rather than from the app (in the native one)."""
    allowed: dict[str, set[str]] = {}
    for handler in handlers:
        for path in handler.paths:
            allowed.setdefault(path, set()).update(handler.http_methods)
    guards: list[HTTPRouteHandler] = []
    for path, methods in allowed.items():
        others: list[Method] = [m for m in HTTP_METHODS if m not in methods]
        if not others:
            continue

        async def refuse(request: AnyRequest) -> None:
            raise MethodNotAllowedException(
                f"{request.method} is not allowed on {request.url.path}"
            )

        guards.append(route(path, http_method=others, include_in_schema=False)(refuse))
    return guards


def dialect_router(
    path: str,
    handlers: Sequence[HTTPRouteHandler],
    *,
    error_body: ErrorBody,
    unknown: Sequence[str] = ("/{rest:path}",),
    tags: Sequence[str] = (),
) -> Router:
    """A router for one dialect's `handlers`, mounted at `path`, whose every failure is
    answered in the dialect's shape (`error_body`): wrong methods on its paths are 405s, other
    paths under the `unknown` patterns (relative to `path`) are 404s, and exceptions are
    mapped by `exception_handlers`."""

    async def not_found(request: AnyRequest, rest: FromPath[str]) -> None:
        raise NotFoundException(f"no route {request.method} {request.url.path}")

    catch_all = route(list(unknown), http_method=list(HTTP_METHODS), include_in_schema=False)
    return Router(
        path=path,
        route_handlers=[*handlers, catch_all(not_found), *method_guards(handlers)],
        exception_handlers=exception_handlers(error_body),
        tags=list(tags),
    )
