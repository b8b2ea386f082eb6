"""The OpenAI dialect's HTTP layer: Chat Completions, Responses and Models under `/v1`."""

from __future__ import annotations

from typing import Any

from litestar import Response, Router, get, post

from exo_api_openai import chat, common, responses
from exo_api_openai.errors import api_error
from exo_api_openai.models import model_list, model_object
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.api.dialect import AnyRequest, answer, decode_body, dialect_router, sse
from exo_core.node import Node
from exo_core.service import GenerationService, ModelNotFound


@post("/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ChatCompletionRequest)
    params = chat.to_params(req, generation.resolve(req.model))
    # The id the answer carries: `POST /v1/cancel/{id}` cancels the generation by it.
    completion_id = common.new_id("chatcmpl-")
    chunks = await generation.generate(req.model, params, request_id=completion_id)
    if req.stream:
        usage = req.stream_options is not None and req.stream_options.include_usage
        stream = chat.ChatStream(req.model, include_usage=usage, completion_id=completion_id)
        return sse(stream, chunks)
    return await answer(
        request, chunks, lambda collected: chat.completion(req.model, collected, completion_id)
    )


@post("/responses", status_code=200)
async def create_response(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ResponsesRequest)
    params = responses.to_params(req, generation.resolve(req.model))
    builder = responses.ResponseBuilder(
        req.model, responses.echo(req, params), logprobs=params.logprobs
    )
    chunks = await generation.generate(req.model, params, request_id=builder.response["id"])
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


def router(path: str = "/v1") -> Router:
    handlers = [chat_completions, create_response, list_models, get_model]
    return dialect_router(path, handlers, error_body=api_error, tags=["openai"])
