"""The Anthropic dialect's HTTP layer: `/v1/messages` and `/v1/messages/count_tokens`."""

from __future__ import annotations

from typing import Any

from litestar import Response, Router, post

from exo_api_claude import translate
from exo_api_claude.types import CountTokensRequest, MessagesRequest
from exo_core.api.dialect import (
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
    sse,
)
from exo_core.generation import GenerationParams
from exo_core.service import GenerationService


@post("/", status_code=200, dependencies=documented_body(MessagesRequest))
async def create_message(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), MessagesRequest)
    params = translate.to_params(req, generation.resolve(req.model))
    chunks = await generation.generate(req.model, params, translate.FIELD_NAMES)
    if req.stream:
        return sse(translate.MessageStream(req.model), chunks)
    return await answer(request, chunks, lambda collected: translate.message(req.model, collected))


@post("/count_tokens", status_code=200, dependencies=documented_body(CountTokensRequest))
async def count_tokens(request: AnyRequest, generation: GenerationService) -> dict[str, int]:
    """An approximation (see `translate.approximate_tokens`): the core exposes no tokenizer."""
    req = decode_body(await request.body(), CountTokensRequest)
    generation.resolve(req.model)
    specs = translate.tools(req.tools)
    params = GenerationParams(messages=translate.messages(req), tools=specs)
    return {"input_tokens": translate.approximate_tokens(params)}


def router() -> Router:
    return dialect_router(
        "/v1/messages",
        [create_message, count_tokens],
        error_body=translate.error_body,
        tags=["anthropic"],
    )
