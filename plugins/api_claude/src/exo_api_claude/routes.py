"""The Anthropic dialect's HTTP layer: `/v1/messages` and `/v1/messages/count_tokens`."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, Router, post, route
from litestar.exceptions import NotFoundException

from exo_api_claude import translate
from exo_api_claude.errors import EXCEPTION_HANDLERS, error_response
from exo_api_claude.http import (
    CLIENT_GONE,
    HTTP_METHODS,
    SSE_HEADERS,
    ClosingStream,
    collect,
    decode_body,
    frames,
    method_guards,
)
from exo_api_claude.types import CountTokensRequest, MessagesRequest
from exo_core.generation import GenerationParams
from exo_core.service import GenerationService

AnyRequest = Request[Any, Any, Any]


@post("/", status_code=200)
async def create_message(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), MessagesRequest)
    params = translate.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params)
    if req.stream:
        body = frames(translate.MessageStream(req.model), chunks)
        return ClosingStream(body, media_type="text/event-stream", headers=SSE_HEADERS)
    collected = await collect(request, chunks)
    if collected is None:
        return Response(None, status_code=CLIENT_GONE)
    result = translate.message(req.model, collected)
    return error_response(500, result) if isinstance(result, str) else Response(result)


@post("/count_tokens", status_code=200)
async def count_tokens(request: AnyRequest, generation: GenerationService) -> dict[str, int]:
    """An approximation (see `translate.approximate_tokens`): the core exposes no tokenizer."""
    req = decode_body(await request.body(), CountTokensRequest)
    generation.resolve(req.model)
    specs = translate.tools(req.tools)
    params = GenerationParams(messages=translate.messages(req), tools=specs)
    return {"input_tokens": translate.approximate_tokens(params)}


@route("/{rest:path}", http_method=list(HTTP_METHODS), include_in_schema=False)
async def unknown_route(request: AnyRequest, rest: str) -> None:
    raise NotFoundException(f"no route {request.method} {request.url.path}")


def router() -> Router:
    guards = method_guards({"/": ["POST"], "/count_tokens": ["POST"]})
    return Router(
        path="/v1/messages",
        route_handlers=[create_message, count_tokens, unknown_route, *guards],
        exception_handlers=EXCEPTION_HANDLERS,
        tags=["anthropic"],
    )
