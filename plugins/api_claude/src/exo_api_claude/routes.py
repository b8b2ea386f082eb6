"""The Anthropic dialect's HTTP layer: `/v1/messages` and `/v1/messages/count_tokens`."""

from __future__ import annotations

from typing import Any

from litestar import Response, Router, post

from exo_api_claude import translate
from exo_api_claude.types import CountTokensRequest, MessagesRequest
from exo_core.plugin import InjectedGeneration
from exo_core.plugin.dialect import (
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
    sse,
)


@post("/", status_code=200, dependencies=documented_body(MessagesRequest))
async def create_message(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    req = decode_body(await request.body(), MessagesRequest)
    params = translate.to_params(req, generation.resolve(req.model))
    # The id the answer carries: `POST /v1/cancel/{id}` cancels the generation by it.
    message_id = translate.new_message_id()
    chunks = await generation.generate(
        req.model, params, translate.FIELD_NAMES, request_id=message_id
    )
    if req.stream:
        return sse(translate.MessageStream(req.model, message_id), chunks)
    return await answer(
        request, chunks, lambda collected: translate.message(req.model, collected, message_id)
    )


@post("/count_tokens", status_code=200, dependencies=documented_body(CountTokensRequest))
async def count_tokens(request: AnyRequest, generation: InjectedGeneration) -> dict[str, int]:
    """Exact: the model's runner applies its chat template and tokenizer (placing the model
    first when it has no instance, as a message would)."""
    req = decode_body(await request.body(), CountTokensRequest)
    params = translate.count_params(req, generation.resolve(req.model))
    return {"input_tokens": await generation.count_tokens(req.model, params)}


def router() -> Router:
    return dialect_router(
        "/v1/messages",
        [create_message, count_tokens],
        error_body=translate.error_body,
        tags=["anthropic"],
    )
