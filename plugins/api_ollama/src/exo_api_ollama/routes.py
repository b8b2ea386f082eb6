"""The Ollama dialect's HTTP layer, under `/api` and again under `/ollama/api` (for clients
whose Ollama base URL must differ from the node's root)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec
from litestar import Response, Router, get, head, post

from exo_api_ollama import models, translate
from exo_api_ollama.types import ChatRequest, GenerateRequest, ShowRequest
from exo_core.plugin import (
    Chunk,
    GenerationService,
    InjectedGeneration,
    InjectedNode,
    InvalidRequest,
    ModelCard,
    ModelNotFound,
    NodeContext,
)
from exo_core.plugin.dialect import (
    NDJSON_MEDIA_TYPE,
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
    ndjson,
)

PREFIXES = ("/api", "/ollama/api")
# Clients configured with a base URL that already ends in /api (or /v1) double it; exo answers
# those paths for chat and tags too.
ALIAS_PREFIXES = ("/ollama/api/api", "/ollama/api/v1")


def _paths(path: str) -> list[str]:
    return [prefix + path for prefix in PREFIXES]


def _alias_paths(path: str) -> list[str]:
    return [prefix + path for prefix in ALIAS_PREFIXES]


def _resolve(generation: GenerationService, name: str) -> ModelCard:
    """Ollama clients add the default tag `:latest` to bare names; accept it."""
    try:
        return generation.resolve(name)
    except ModelNotFound:
        if name.endswith(":latest"):
            return generation.resolve(name.removesuffix(":latest"))
        raise


def _modified_at(node: NodeContext) -> str:
    return datetime.fromtimestamp(node.started_at, UTC).isoformat().replace("+00:00", "Z")


async def _load(
    generation: GenerationService,
    card: ModelCard,
    reply: translate.Reply,
    req: ChatRequest | GenerateRequest,
) -> Response[Any]:
    """An empty request only loads the model, as in Ollama (clients use it to preload)."""
    if translate.is_unload(req.keep_alive):
        raise InvalidRequest(
            "unloading through keep_alive 0 is not supported: delete the instance "
            "with DELETE /instance/{id}"
        )
    await generation.instance_for(card)
    body = reply.loaded()
    if req.stream:
        return Response(msgspec.json.encode(body) + b"\n", media_type=NDJSON_MEDIA_TYPE)
    return Response(body)


async def _answer(
    request: AnyRequest, reply: translate.Reply, chunks: AsyncIterator[Chunk], stream: bool
) -> Response[Any]:
    if stream:
        return ndjson(reply, chunks)
    return await answer(request, chunks, reply.result)


@post(_paths("/chat"), status_code=200, dependencies=documented_body(ChatRequest))
async def chat(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    return await _chat(request, generation)


# Aliases answer like their main path and stay out of the OpenAPI schema (one operation each).
@post(_alias_paths("/chat"), status_code=200, include_in_schema=False)
async def chat_alias(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    return await _chat(request, generation)


async def _chat(request: AnyRequest, generation: GenerationService) -> Response[Any]:
    req = decode_body(await request.body(), ChatRequest)
    card = _resolve(generation, req.model)
    reply = translate.Reply(req.model, "chat")
    if not req.messages:
        return await _load(generation, card, reply, req)
    params = translate.chat_params(req, card)
    chunks = await generation.generate(card.model_id, params, translate.FIELD_NAMES)
    return await _answer(request, reply, chunks, req.stream)


@post(_paths("/generate"), status_code=200, dependencies=documented_body(GenerateRequest))
async def generate(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    req = decode_body(await request.body(), GenerateRequest)
    card = _resolve(generation, req.model)
    reply = translate.Reply(req.model, "generate")
    if not req.prompt and not req.images:
        return await _load(generation, card, reply, req)
    params = translate.generate_params(req, card)
    chunks = await generation.generate(card.model_id, params, translate.FIELD_NAMES)
    return await _answer(request, reply, chunks, req.stream)


@get(_paths("/tags"))
async def tags(node: InjectedNode) -> dict[str, Any]:
    return _tags(node)


@get(_alias_paths("/tags"), include_in_schema=False)
async def tags_alias(node: InjectedNode) -> dict[str, Any]:
    return _tags(node)


def _tags(node: NodeContext) -> dict[str, Any]:
    when = _modified_at(node)
    cards = sorted(node.cards().values(), key=lambda c: c.model_id)
    return {"models": [models.model_entry(c, when) for c in cards]}


@get(_paths("/ps"))
async def running(node: InjectedNode) -> dict[str, Any]:
    ids = sorted({i.model_id for i in node.state.instances.values()})
    cards = [card for card in (node.card(i) for i in ids) if card is not None]
    return {"models": [models.running_entry(c) for c in cards]}


@post(_paths("/show"), status_code=200, dependencies=documented_body(ShowRequest))
async def show(
    request: AnyRequest, node: InjectedNode, generation: InjectedGeneration
) -> dict[str, Any]:
    req = decode_body(await request.body(), ShowRequest)
    name = req.model or req.name
    if not name:
        raise InvalidRequest("model is required")
    return models.show(_resolve(generation, name), _modified_at(node))


@get(_paths("/version"))
async def version() -> dict[str, str]:
    return {"version": translate.OLLAMA_VERSION}


@get("/ollama", media_type="text/plain")
async def alive() -> str:
    return "Ollama is running"


@head(["/ollama", "/ollama/api/version"])
async def alive_head() -> None:
    """Health probes that only look at the status."""
    return None


def router() -> Router:
    handlers = [chat, chat_alias, generate, tags, tags_alias, running, show, version]
    handlers += [alive, alive_head]
    return dialect_router(
        "/",
        handlers,
        error_body=translate.error_body,
        unknown=("/api/{rest:path}", "/ollama/{rest:path}"),
        tags=["ollama"],
    )
