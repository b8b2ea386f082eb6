"""Generation for models whose caches mlx-lm's `BatchGenerator` cannot batch.

The batch generator prefills several prompts together and merges their caches into one batch
cache, layer by layer, with each cache type's `merge` (mlx-lm generate.py, `_merge_caches`). A
type without one ("does not yet support batching with history": llama4's `ChunkedKVCache`,
deepseek_v41's `LayerCache`) cannot go through it at all, not even one request alone.
`batchable` is that test, on a model's own cache list.

`SoloGenerator` serves such models with the batch generator's interface (`insert`, `next`,
`remove`, `close`), so `BatchEngine` keeps every rule of its own (samplers and their guard,
stop strings, output parsing, logprobs, usage, cancellation, the prefix cache) on this path
too. Each request has its own cache (the model's `make_prompt_cache`, or the copy of a stored
prefix's cache the engine passes in); a finished request hands its cache back for the engine
to store as it is (the request is done with it). A step prefills one chunk of the oldest
waiting prompt and advances every decoding request by one token, each on its own cache in
turn. A request's decode is mlx-lm's own decode batch (`GenerationBatch`) holding that one
request: the same logits processors, normalisation, sampling and stop rules as the batched
path, so a request's tokens are those it gets alone.

Why in turn rather than one request after the other: a batch of one costs about the same per
token either way, so the total time is the same, while in turn every request streams from its
first step on, as with the batch generator (bench/bench_unbatched.py measures both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import PromptProcessingBatch, StopSequences, generation_stream
from mlx_lm.models.cache import CacheList, make_prompt_cache

from exo_engine_mlx.generation_batch import ARGMAX, ExoGenerationBatch
from exo_engine_mlx.sampling import LogitsProcessor, Sampler


def batchable(caches: Sequence[Any]) -> bool:
    """Whether mlx-lm's batch generator can batch a model with this cache list: every cache
    type (each part of a `CacheList`) has the `merge` it calls."""

    def mergeable(cache: Any) -> bool:
        if isinstance(cache, CacheList):
            return all(mergeable(c) for c in cache.caches)
        return callable(getattr(type(cache), "merge", None))

    return all(mergeable(c) for c in caches)


def has_recurrent_state(model: Any) -> bool:
    """Whether the model carries a recurrent state (SSM, convolution, linear attention) in its
    cache. mlx-lm prefills a batch's prompts left-padded to one length; not every family masks
    the padding out of such a state (Nemotron-H's mamba blocks run over it), which changes a
    shorter prompt's answer. Prompts of these models are therefore prefilled one at a time and
    join the decode batch after: the same answer as alone, at the cost of batched prefill."""
    from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

    def recurrent(cache: Any) -> bool:
        if isinstance(cache, CacheList):  # a layer with several caches (Falcon-H1, ...)
            return any(recurrent(c) for c in cache.caches)
        return isinstance(cache, ArraysCache)

    return any(recurrent(c) for c in make_prompt_cache(model))


def can_batch(model: Any) -> bool:
    """Whether mlx-lm's batch generator can batch this model's caches (`batchable`)."""
    from mlx_lm.models.cache import make_prompt_cache

    return batchable(make_prompt_cache(model))


class _OneSequence(ExoGenerationBatch):
    """mlx-lm's decode batch holding one request on its own cache. A finished request's cache
    is simply its own (these cache types have no `extract` to cut one out of a batch)."""

    def extract_cache(self, idx: int) -> list[Any]:
        return list(self.prompt_cache)


@dataclass
class _Request:
    uid: int
    cache: list[Any]
    # Prompt tokens not prefilled yet; the last one is the first decode step's input.
    prompt: list[int]
    # The tokens in the cache (the logits processors' context, as the batch generator keeps it).
    tokens: list[int]
    max_tokens: int
    sampler: Sampler
    processors: tuple[LogitsProcessor, ...]
    total: int = 0
    done: int = 0
    decode: _OneSequence | None = field(default=None, repr=False)


class SoloGenerator:
    """The batch generator's interface over requests that each keep their own cache."""

    def __init__(
        self,
        model: Any,
        *,
        stop_tokens: Sequence[Sequence[int]],
        completion_batch_size: int = 8,
        prefill_step_size: int = 2048,
    ) -> None:
        self.model = model
        self._stop = StopSequences(stop_tokens)
        self._most = completion_batch_size
        self._prefill_step = prefill_step_size
        self._next_uid = 0
        self._waiting: list[_Request] = []  # in arrival order; the first one is prefilling
        self._decoding: list[_Request] = []

    @property
    def prefilling(self) -> bool:
        return bool(self._waiting) and len(self._decoding) < self._most

    def insert(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        caches: list[list[Any]] | None = None,
        all_tokens: list[list[int]] | None = None,
        samplers: list[Sampler] | None = None,
        logits_processors: list[list[LogitsProcessor]] | None = None,
    ) -> list[int]:
        uids: list[int] = []
        for i, prompt in enumerate(prompts):
            if not prompt or max_tokens[i] <= 0:
                raise ValueError("a request needs a prompt and max_tokens > 0")
            cache = caches[i] if caches is not None else make_prompt_cache(self.model)
            held = list(all_tokens[i]) if all_tokens is not None else []
            request = _Request(
                uid=self._next_uid,
                cache=cache,
                prompt=list(prompt),
                tokens=held,
                max_tokens=max_tokens[i],
                sampler=samplers[i] if samplers is not None else ARGMAX,
                processors=tuple(logits_processors[i]) if logits_processors else (),
                total=len(prompt),
            )
            self._waiting.append(request)
            uids.append(request.uid)
            self._next_uid += 1
        return uids

    def remove(self, uids: Sequence[int]) -> None:
        gone = set(uids)
        self._waiting = [r for r in self._waiting if r.uid not in gone]
        self._decoding = [r for r in self._decoding if r.uid not in gone]

    def next(self) -> tuple[list[Any], list[Any]]:
        """One step, as the batch generator's: every decoding request's next token, then one
        prefill chunk. Returns (prompt progress, generated tokens) in its response types."""
        with mx.stream(generation_stream):
            generated: list[Any] = []
            for request in list(self._decoding):
                assert request.decode is not None
                generated.extend(request.decode.next())
                if len(request.decode) == 0:  # finished: mlx-lm emptied its batch
                    self._decoding.remove(request)
            progress = self._prefill() if self.prefilling else []
            return progress, generated

    def _prefill(self) -> list[Any]:
        """One chunk of the oldest waiting prompt; a prompt left with its last token starts
        decoding (the decode batch runs its first step at once, as mlx-lm's does)."""
        request = self._waiting[0]
        Response = PromptProcessingBatch.Response
        if len(request.prompt) == 1:
            self._waiting.pop(0)
            request.decode = _OneSequence(
                self.model,
                [request.uid],
                mx.array(request.prompt),
                request.cache,
                [request.tokens],
                [request.sampler],
                ARGMAX,
                [list(request.processors)],
                [self._stop],
                [request.max_tokens],
            )
            self._decoding.append(request)
            return [Response(request.uid, (request.total, request.total), True, True)]
        n = min(self._prefill_step, len(request.prompt) - 1)
        chunk, request.prompt = request.prompt[:n], request.prompt[n:]
        self.model(mx.array(chunk)[None], cache=request.cache)
        mx.eval([c.state for c in request.cache])
        mx.clear_cache()
        request.tokens += chunk
        request.done += n
        return [Response(request.uid, (request.done, request.total), False, False)]

    def close(self) -> None:
        self._waiting.clear()
        self._decoding.clear()
