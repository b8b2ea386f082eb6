"""The OpenAI dialect's HTTP layer: Chat Completions, Responses and Models under `/v1`."""

from __future__ import annotations

from typing import Any

from litestar import Response, Router, get, post

from exo_api_openai import chat, responses
from exo_api_openai.errors import api_error
from exo_api_openai.models import model_list, model_object
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.api.dialect import (
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
    sse,
)
from exo_core.node import Node
from exo_core.service import GenerationService, ModelNotFound


@post("/chat/completions", status_code=200, dependencies=documented_body(ChatCompletionRequest))
async def chat_completions(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ChatCompletionRequest)
    params = chat.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params, chat.field_names(req))
    if req.stream:
        usage = req.stream_options is not None and req.stream_options.include_usage
        return sse(chat.ChatStream(req.model, include_usage=usage), chunks)
    return await answer(request, chunks, lambda collected: chat.completion(req.model, collected))


@post("/responses", status_code=200, dependencies=documented_body(ResponsesRequest))
async def create_response(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ResponsesRequest)
    params = responses.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params, responses.FIELD_NAMES)
    builder = responses.ResponseBuilder(
        req.model, responses.echo(req, params), logprobs=params.logprobs
    )
    if req.stream:
        return sse(builder, chunks)
    return await answer(request, chunks, lambda collected: responses.build(builder, collected))


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


def router() -> Router:
    handlers = [chat_completions, create_response, list_models, get_model]
    return dialect_router("/v1", handlers, error_body=api_error, tags=["openai"])
