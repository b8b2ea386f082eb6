"""The OpenAI dialect's HTTP layer: Chat Completions, Responses and Models under `/v1`."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, Router, get, post, route
from litestar.exceptions import NotFoundException

from exo_api_openai import chat, responses
from exo_api_openai.errors import EXCEPTION_HANDLERS, error_response
from exo_api_openai.http import (
    CLIENT_GONE,
    HTTP_METHODS,
    SSE_HEADERS,
    ClosingStream,
    Renderer,
    collect,
    decode_body,
    frames,
    method_guards,
)
from exo_api_openai.models import model_list, model_object
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.node import Node
from exo_core.service import GenerationService, ModelNotFound

AnyRequest = Request[Any, Any, Any]


def _sse(renderer: Renderer, chunks: Any) -> Response[Any]:
    return ClosingStream(
        frames(renderer, chunks), media_type="text/event-stream", headers=SSE_HEADERS
    )


@post("/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ChatCompletionRequest)
    params = chat.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params)
    if req.stream:
        usage = req.stream_options is not None and req.stream_options.include_usage
        return _sse(chat.ChatStream(req.model, include_usage=usage), chunks)
    collected = await collect(request, chunks)
    if collected is None:
        return Response(None, status_code=CLIENT_GONE)
    result = chat.completion(req.model, collected)
    return error_response(500, result) if isinstance(result, str) else Response(result)


@post("/responses", status_code=200)
async def create_response(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ResponsesRequest)
    params = responses.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params)
    builder = responses.ResponseBuilder(
        req.model, responses.echo(req, params), logprobs=params.logprobs
    )
    if req.stream:
        return _sse(builder, chunks)
    collected = await collect(request, chunks)
    if collected is None:
        return Response(None, status_code=CLIENT_GONE)
    result = responses.build(builder, collected)
    return error_response(500, result) if isinstance(result, str) else Response(result)


@get("/models")
async def list_models(node: Node) -> dict[str, Any]:
    cards = sorted(node.cards().values(), key=lambda c: c.model_id)
    return model_list(cards, int(node.started_at))


@get("/models/{model_id:path}")
async def get_model(node: Node, model_id: str) -> dict[str, Any]:
    card = node.card(model_id.lstrip("/"))
    if card is None:
        raise ModelNotFound(f"model '{model_id.lstrip('/')}' is not known to this cluster")
    return model_object(card, int(node.started_at))


@route("/{rest:path}", http_method=list(HTTP_METHODS), include_in_schema=False)
async def unknown_route(request: AnyRequest, rest: str) -> None:
    raise NotFoundException(f"no route {request.method} {request.url.path}")


def router() -> Router:
    guards = method_guards(
        {
            "/chat/completions": ["POST"],
            "/responses": ["POST"],
            "/models": ["GET"],
            "/models/{model_id:path}": ["GET"],
        }
    )
    return Router(
        path="/v1",
        route_handlers=[
            chat_completions,
            create_response,
            list_models,
            get_model,
            unknown_route,
            *guards,
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        tags=["openai"],
    )
