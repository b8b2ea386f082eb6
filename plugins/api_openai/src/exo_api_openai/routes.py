"""The OpenAI dialect's HTTP layer: Chat Completions, Responses and Models under `/v1`."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response, Router, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import File

from exo_api_openai import chat_answer, images, responses, translate
from exo_api_openai.images import MEDIA_TYPES
from exo_api_openai.translate import api_error
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.plugin import (
    GenerationService,
    InjectedGeneration,
    InjectedNode,
    ModelCard,
    ModelNotFound,
    NodeContext,
    new_id,
)
from exo_core.plugin.dialect import (
    ACCEPTS_OPT,
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
    exception_handlers,
    sse,
)


def model_object(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's model object, plus the fields exo's model list adds (Open WebUI reads some):
    size, family, capabilities, reasoning dialect... `tasks` are this project's names
    (text_generation, image_generation, image_edit), so clients can tell image models from
    text models."""
    return {
        "id": card.model_id,
        "object": "model",
        "created": created,
        "owned_by": "exo",
        "hugging_face_id": card.model_id,
        "name": card.model_id.split("/")[-1],
        "description": "",
        "context_length": card.context_length or 0,
        "tags": [],
        "storage_size_megabytes": round(card.storage_size_bytes / 2**20),
        "supports_tensor": card.supports_tensor,
        "tasks": [t.value for t in card.tasks],
        "is_custom": card.custom,
        "family": card.family,
        "quantization": card.quantization,
        "base_model": card.base_model,
        "capabilities": [c.value for c in card.capabilities],
        "reasoning_dialect": card.reasoning_dialect,
    }


def model_list(cards: list[ModelCard], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(c, created) for c in cards]}


@post("/chat/completions", status_code=200, dependencies=documented_body(ChatCompletionRequest))
async def chat_completions(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    req = decode_body(await request.body(), ChatCompletionRequest)
    params = translate.to_params(req, generation.resolve(req.model))
    # The id the answer carries: `POST /v1/cancel/{id}` cancels the generation by it.
    completion_id = new_id("chatcmpl", size=24)
    chunks = await generation.generate(
        req.model, params, translate.field_names(req), request_id=completion_id
    )
    if req.stream:
        usage = req.stream_options is not None and req.stream_options.include_usage
        stream = chat_answer.ChatStream(req.model, include_usage=usage, completion_id=completion_id)
        return sse(stream, chunks)
    return await answer(
        request,
        chunks,
        lambda collected: chat_answer.completion(req.model, collected, completion_id),
    )


@post("/responses", status_code=200, dependencies=documented_body(ResponsesRequest))
async def create_response(request: AnyRequest, generation: InjectedGeneration) -> Response[Any]:
    req = decode_body(await request.body(), ResponsesRequest)
    params = responses.to_params(req, generation.resolve(req.model))
    builder = responses.ResponseBuilder(
        req.model, responses.echo(req, params), logprobs=params.logprobs
    )
    chunks = await generation.generate(
        req.model, params, responses.FIELD_NAMES, request_id=builder.response["id"]
    )
    if req.stream:
        return sse(builder, chunks)
    return await answer(request, chunks, lambda collected: responses.build(builder, collected))


@post("/images/generations", status_code=200, dependencies=documented_body(images.ImagesRequest))
async def create_images(
    request: AnyRequest, generation: InjectedGeneration, node: InjectedNode
) -> Response[Any]:
    req = decode_body(await request.body(), images.ImagesRequest)
    return await _images(request, generation, node, req, None)


@post(
    "/images/edits",
    status_code=200,
    dependencies=documented_body(images.EditForm, RequestEncodingType.MULTI_PART),
    opt={ACCEPTS_OPT: ("multipart/form-data",)},
)
async def edit_images(
    request: AnyRequest, generation: InjectedGeneration, node: InjectedNode
) -> Response[Any]:
    req, upload = await images.edit_request(request)
    return await _images(request, generation, node, req, upload)


async def _images(
    request: AnyRequest,
    generation: GenerationService,
    node: NodeContext,
    req: images.ImagesRequest,
    upload: bytes | None,
) -> Response[Any]:
    model = images.require_model(req)
    # OpenAI's image answers carry no id: this one is in the `x-request-id` header (and in
    # streamed progress events); `POST /v1/cancel/{id}` cancels the generation by it.
    request_id = new_id("img", size=24)
    headers = {"x-request-id": request_id}
    chunks = await generation.generate_images(
        model, images.to_image_request(req, upload), request_id=request_id
    )
    if req.stream:
        kind = "image_edit" if upload else "image_generation"
        return sse(images.ImageStream(kind, request_id), chunks, headers)
    store = images.store_for(node.config.data_path)
    base = str(request.base_url)
    response = await answer(
        request,
        chunks,
        lambda got: images.images_response(got, req.response_format or "b64_json", store, base),
    )
    response.headers.update(headers)
    return response


@get("/models")
async def list_models(node: InjectedNode) -> dict[str, Any]:
    cards = sorted(node.cards().values(), key=lambda c: c.model_id)
    return model_list(cards, int(node.started_at))


@get("/models/{model_id:path}")
async def get_model(node: InjectedNode, model_id: FromPath[str]) -> dict[str, Any]:
    card = node.card(model_id.lstrip("/"))
    if card is None:
        raise ModelNotFound(f"model '{model_id.lstrip('/')}' is not known to this cluster")
    return model_object(card, int(node.started_at))


@get("/")
async def list_images(node: InjectedNode) -> dict[str, Any]:
    stored = images.store_for(node.config.data_path).list()
    return {"object": "list", "data": [msgspec.to_builtins(i) for i in stored]}


@get("/{image_id:str}")
async def get_image(node: InjectedNode, image_id: FromPath[str]) -> File:
    path = images.store_for(node.config.data_path).path(image_id)
    if path is None:
        raise NotFoundException(f"no stored image '{image_id}' (it may have expired)")
    return File(
        path=path,
        media_type=MEDIA_TYPES[path.suffix.lstrip(".")],
        content_disposition_type="inline",
    )


def router(path: str = "/v1") -> Router:
    handlers = [
        chat_completions,
        create_response,
        create_images,
        edit_images,
        list_models,
        get_model,
    ]
    return dialect_router(path, handlers, error_body=api_error, tags=["openai"])


def stored_images_router() -> Router:
    """The images kept for `response_format=url` (outside /v1, as their URLs say)."""
    return Router(
        path="/images",
        route_handlers=[list_images, get_image],
        exception_handlers=exception_handlers(api_error),
        tags=["openai"],
    )
