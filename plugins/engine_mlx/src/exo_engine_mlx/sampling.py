"""Per-request samplers and logits processors on top of mlx-lm's sampling pieces."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    make_repetition_penalty,
)

from exo_core.plugin import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

# mlx-lm's own default context for repetition penalties; used when a request names none.
DEFAULT_REPETITION_CONTEXT = 20


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def make_sampler(params: SamplingParams) -> Sampler:
    """A sampler with its own random key when the request has a seed, so that seeded requests
    are reproducible whatever else shares the batch."""
    if params.temperature == 0:
        return greedy
    key = mx.random.key(params.seed) if params.seed is not None else None
    inverse_temperature = 1.0 / params.temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        if 0 < params.top_p < 1.0:
            logprobs = apply_top_p(logprobs, params.top_p)
        if params.min_p > 0:
            logprobs = apply_min_p(logprobs, params.min_p)
        if params.top_k > 0:
            logprobs = apply_top_k(logprobs, params.top_k)
        if key is None:
            return mx.random.categorical(logprobs * inverse_temperature)
        key, subkey = mx.random.split(key)
        return mx.random.categorical(logprobs * inverse_temperature, key=subkey)

    return sample


def ban_tokens(token_ids: list[int]) -> LogitsProcessor:
    """A processor that makes `token_ids` impossible (end-of-sequence, for benchmarks that
    need exactly `max_tokens`)."""
    banned = mx.array(token_ids)

    def ban(_tokens: mx.array, logits: mx.array) -> mx.array:
        logits[..., banned] = -mx.inf
        return logits

    return ban


def output_penalties(presence: float, frequency: float, prompt_tokens: int) -> LogitsProcessor:
    """OpenAI's presence and frequency penalties: every token the answer holds so far loses
    `presence` once and `frequency` for each time it occurs.

    Only the answer counts, not the prompt (as OpenAI and vLLM define them; mlx-lm's own
    penalties look at the last 20 tokens, prompt included). A processor is handed every token
    in the sequence's cache, the prompt's `prompt_tokens` first."""

    def penalise(tokens: mx.array, logits: mx.array) -> mx.array:
        generated = tokens.reshape(-1)[prompt_tokens:]
        if generated.size == 0:
            return logits
        counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[generated].add(1.0)
        penalty = counts * frequency + (counts > 0).astype(mx.float32) * presence
        return (logits - penalty).astype(logits.dtype)

    return penalise


def make_processors(params: SamplingParams, *, prompt_tokens: int) -> list[LogitsProcessor]:
    """The request's logits processors; `prompt_tokens` is the length of its prompt (the
    context's leading tokens that the presence and frequency penalties leave out)."""
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty is not None and params.repetition_penalty != 1.0:
        context = params.repetition_context_size or DEFAULT_REPETITION_CONTEXT
        processors.append(make_repetition_penalty(params.repetition_penalty, max(1, context)))
    if params.presence_penalty or params.frequency_penalty:
        processors.append(
            output_penalties(params.presence_penalty, params.frequency_penalty, prompt_tokens)
        )
    return processors
