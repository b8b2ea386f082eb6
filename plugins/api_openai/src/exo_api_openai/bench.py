"""exo's bench route: `POST /bench/chat/completions`.

The body is a Chat Completions request; the answer is the completion plus `generation_stats`
measured in the server. It follows exo's bench method so that figures compare between runs and
machines: end-of-sequence is banned, so exactly `max_tokens` come out; the prefix cache is off
unless the body asks for it (`"use_prefix_cache": true`), and the stats say whether the prompt
was found in it (`none`, `partial`, `exact`).

exo's image bench routes: `POST /bench/images/generations` (a JSON body, as
`/v1/images/generations`) and `POST /bench/images/edits` (a multipart upload, as
`/v1/images/edits`). The answer is the images plus exo's `generation_stats`
(`ImageGenerationStats`: seconds per step, total time, steps, images, size, peak memory)
and `power_usage`, which is null: no node here samples its power draw.

The times are taken at the API as the chunks arrive (the first step's progress to the
last's, over the steps between them), so they include the hop from the runner.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Literal

import msgspec
from litestar import Response, Router, post
from litestar.enums import RequestEncodingType

from exo_api_openai import chat_answer, images, translate
from exo_api_openai.translate import api_error
from exo_api_openai.types import ChatCompletionRequest
from exo_core.plugin import (
    Chunk,
    FinishChunk,
    GenerationService,
    ImageChunk,
    InjectedGeneration,
    InjectedNode,
    InvalidRequest,
    NodeContext,
    ProgressChunk,
    Usage,
    new_id,
)
from exo_core.plugin.dialect import (
    ACCEPTS_OPT,
    AnyRequest,
    answer,
    decode_body,
    dialect_router,
    documented_body,
)


class StepClock:
    """When each chunk of one generation arrived, for exo's `ImageGenerationStats`."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.steps: list[float] = []  # arrival of each progress chunk
        self.ended = self.started

    async def watch(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        async with aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                now = time.perf_counter()
                if isinstance(chunk, ProgressChunk):
                    self.steps.append(now)
                self.ended = now
                yield chunk

    def stats(self, collected: list[Chunk]) -> dict[str, Any]:
        finals = sorted(
            (c for c in collected if isinstance(c, ImageChunk) and not c.partial),
            key=lambda c: c.index,
        )
        finish = next((c for c in collected if isinstance(c, FinishChunk)), None)
        totals = [c.total for c in collected if isinstance(c, ProgressChunk)]
        total = self.ended - self.started
        spans = len(self.steps) - 1
        per_step = (self.steps[-1] - self.steps[0]) / spans if spans > 0 else total
        return {
            "seconds_per_step": per_step,
            "total_generation_time": total,
            "num_inference_steps": max(totals, default=0),
            "num_images": len(finals),
            "image_width": finals[0].width if finals else 0,
            "image_height": finals[0].height if finals else 0,
            # exo's `Memory`
            "peak_memory_usage": {"inBytes": finish.usage.peak_memory_bytes if finish else 0},
        }


async def _bench(
    request: AnyRequest,
    generation: GenerationService,
    node: NodeContext,
    req: images.ImagesRequest,
    upload: bytes | None,
) -> Response[Any]:
    if req.stream:
        raise InvalidRequest("the bench routes answer one JSON object: stream must be false")
    model = images.require_model(req)
    req = msgspec.structs.replace(req, stream=False, partial_images=0)
    request_id = new_id("img", size=24)
    clock = StepClock()
    chunks = await generation.generate_images(
        model, images.to_image_request(req, upload), request_id=request_id
    )
    store = images.store_for(node.config.data_path)
    base = str(request.base_url)

    def build(collected: list[Chunk]) -> dict[str, Any]:
        body = images.images_response(collected, req.response_format or "b64_json", store, base)
        return {**body, "generation_stats": clock.stats(collected), "power_usage": None}

    response = await answer(request, clock.watch(chunks), build)
    response.headers["x-request-id"] = request_id
    return response


@post("/images/generations", status_code=200, dependencies=documented_body(images.ImagesRequest))
async def bench_image_generations(
    request: AnyRequest, generation: InjectedGeneration, node: InjectedNode
) -> Response[Any]:
    req = decode_body(await request.body(), images.ImagesRequest)
    return await _bench(request, generation, node, req, None)


@post(
    "/images/edits",
    status_code=200,
    dependencies=documented_body(images.EditForm, RequestEncodingType.MULTI_PART),
    opt={ACCEPTS_OPT: ("multipart/form-data",)},
)
async def bench_image_edits(
    request: AnyRequest, generation: InjectedGeneration, node: InjectedNode
) -> Response[Any]:
    req, upload = await images.edit_request(request)
    return await _bench(request, generation, node, req, upload)


IMAGE_HANDLERS = [bench_image_generations, bench_image_edits]


PrefixCacheHit = Literal["none", "partial", "exact"]


class BenchRequest(ChatCompletionRequest, kw_only=True):
    use_prefix_cache: bool = False


def prefix_cache_hit(usage: Usage) -> PrefixCacheHit:
    """How much of the prompt came from the prefix cache. A full hit still prefills the last
    token (it yields the first output), so `prompt_tokens - 1` cached tokens is exact."""
    if usage.cached_tokens <= 0:
        return "none"
    if usage.cached_tokens >= usage.prompt_tokens - 1:
        return "exact"
    return "partial"


def generation_stats(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tps": usage.prompt_tps,
        "generation_tps": usage.generation_tps,
        "prompt_tokens": usage.prompt_tokens,
        "generation_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "time_to_first_token_s": usage.time_to_first_token_s,
        "peak_memory_bytes": usage.peak_memory_bytes,
        "prefix_cache_hit": prefix_cache_hit(usage),
    }


@post("/chat/completions", status_code=200, dependencies=documented_body(BenchRequest))
async def bench_chat_completions(
    request: AnyRequest, generation: InjectedGeneration
) -> Response[Any]:
    req = decode_body(await request.body(), BenchRequest)
    if req.stream:
        raise InvalidRequest("the bench route answers one JSON object: stream must be false")
    params = translate.to_params(req, generation.resolve(req.model))
    if params.max_tokens is None:
        raise InvalidRequest("the bench route needs max_tokens (exactly that many come out)")
    params = msgspec.structs.replace(params, ignore_eos=True, prefix_cache=req.use_prefix_cache)
    completion_id = new_id("chatcmpl", size=24)
    chunks = await generation.generate(req.model, params, request_id=completion_id)

    def build(collected: list[Chunk]) -> dict[str, Any]:
        body = chat_answer.completion(
            req.model, collected, completion_id
        )  # raises without a finish
        finish = next(c for c in collected if isinstance(c, FinishChunk))
        return {**body, "generation_stats": generation_stats(finish.usage)}

    return await answer(request, chunks, build)


def router() -> Router:
    handlers = [bench_chat_completions, *IMAGE_HANDLERS]
    return dialect_router("/bench", handlers, error_body=api_error, tags=["openai"])
