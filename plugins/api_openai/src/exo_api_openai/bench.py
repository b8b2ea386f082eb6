"""exo's bench route: `POST /bench/chat/completions`.

The body is a Chat Completions request; the answer is the completion plus `generation_stats`
measured in the server. It follows exo's bench method so that figures compare between runs and
machines: end-of-sequence is banned, so exactly `max_tokens` come out; the prefix cache is off
unless the body asks for it (`"use_prefix_cache": true`), and the stats say whether the prompt
was found in it (`none`, `partial`, `exact`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Response, Router, post

from exo_api_openai import bench_images, chat, common
from exo_api_openai.errors import api_error
from exo_api_openai.types import ChatCompletionRequest
from exo_core.plugin import Chunk, FinishChunk, InjectedGeneration, InvalidRequest, Usage
from exo_core.plugin.dialect import AnyRequest, answer, decode_body, dialect_router, documented_body

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
    params = chat.to_params(req, generation.resolve(req.model))
    if params.max_tokens is None:
        raise InvalidRequest("the bench route needs max_tokens (exactly that many come out)")
    params = msgspec.structs.replace(params, ignore_eos=True, prefix_cache=req.use_prefix_cache)
    completion_id = common.new_id("chatcmpl-")
    chunks = await generation.generate(req.model, params, request_id=completion_id)

    def build(collected: list[Chunk]) -> dict[str, Any]:
        body = chat.completion(req.model, collected, completion_id)  # raises without a finish
        finish = next(c for c in collected if isinstance(c, FinishChunk))
        return {**body, "generation_stats": generation_stats(finish.usage)}

    return await answer(request, chunks, build)


def router() -> Router:
    handlers = [bench_chat_completions, *bench_images.HANDLERS]
    return dialect_router("/bench", handlers, error_body=api_error, tags=["openai"])
