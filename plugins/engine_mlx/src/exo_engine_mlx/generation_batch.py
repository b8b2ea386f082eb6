"""mlx-lm's decode batch with a cheaper step for greedy requests that read no logprobs.

mlx-lm's `GenerationBatch._step` normalises every row's logits to log-probabilities (a
logsumexp and a subtraction over the whole vocabulary: 8 x 49152 values on SmolLM2, single-
threaded on the CPU) and, when the rows' samplers are different objects, samples each row on
its own slice. A greedy request that asked for no logprobs needs neither: its token is the
argmax of its logits. Such requests share one sampler object, `ARGMAX`; when every row of the
batch has it, `ExoGenerationBatch` takes one argmax over the batch's logits and skips the
normalisation. Any other batch (sampling, logprobs) gets mlx-lm's own normalisation and
sampling, unchanged.

On a pipeline whose model has `last_rank_sampling` (distributed/sampled.py), only the last rank
has the logits: after sampling, the group shares that rank's tokens and the logprobs the
requests read (`ReadsLogprobs`), a few bytes a sequence, instead of the whole logits.

The argmax of the logits is the greedy token itself (the argmax of the normalised values can
differ from it only where subtracting the logsumexp rounds two different logits to one value).
The `logprobs` of a response of an `ARGMAX` row hold the row's raw logits: nobody reads them
(the request asked for none).

`ready_first_tokens`: a sequence whose prompt was read in this step already has its first token
(mlx-lm computes it as the sequence joins the decode batch) but mlx-lm hands it out only in the
next step, after that step has built and run the next token's forward (~21 ms of a ~50 ms
first token for a cached prompt on SmolLM2, 2-core CPU): the engine hands it out at once.

`install` puts this class in a `BatchGenerator`: the generator keeps one decode batch for its
whole life and merges each newly prefilled group of sequences into it (`extend`); the prefill
batch (`ExoPromptBatch`) makes its sequences' first decode batch of this class too, so every
decode step, a sequence's first token included, runs here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch

from exo_engine_mlx.distributed.sampled import LastRankSampling


class _Argmax:
    """The greedy sampler of requests that read no logprobs (one shared object: see module)."""

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.argmax(logprobs, axis=-1)

    def __repr__(self) -> str:
        return "ARGMAX"


ARGMAX = _Argmax()


class ReadsLogprobs:
    """The sampler of a request that reads logprobs: its token's and `top` alternatives'.
    (Where only a pipeline's last rank has the logits, these are what the group shares.)"""

    def __init__(self, sampler: Callable[[mx.array], mx.array], top: int) -> None:
        self.sampler = sampler
        self.top = top

    def __call__(self, logprobs: mx.array) -> mx.array:
        return self.sampler(logprobs)


class ExoGenerationBatch(GenerationBatch):
    def _step(self) -> tuple[list[int], list[mx.array]]:
        # mlx-lm's step (generate.py, GenerationBatch._step), with one argmax for an all-ARGMAX
        # batch, and on a pipeline the last rank's tokens shared (distributed/sampled.py).
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        logits, context = self._processed(inputs, logits)
        samplers: list[Any] = [
            self.fallback_sampler if s is None else s
            for s in (self.samplers or [None] * len(self.uids))
        ]
        sampled, rows = _sampled(samplers, logits)
        sharing: LastRankSampling | None = getattr(self.model, "last_rank_sampling", None)
        if sharing is not None:
            tops = [s.top if isinstance(s, ReadsLogprobs) else None for s in samplers]
            sampled, rows = sharing.share(sampled, rows, tops)
        self._next_tokens = sampled
        self._next_logprobs = rows
        mx.async_eval(self._next_tokens, self._next_logprobs, context)
        mx.eval(inputs, self._current_logprobs)
        tokens: list[int] = inputs.tolist()  # type: ignore[assignment]
        for held, token in zip(self.tokens, tokens, strict=True):
            held.append(token)
        return tokens, self._current_logprobs

    def _processed(self, inputs: mx.array, logits: mx.array) -> tuple[mx.array, list[mx.array]]:
        """The rows' logits processors (repetition penalty, banned tokens), row by row as
        mlx-lm runs them, with the token context of the rows that have any."""
        per_row = self.logits_processors or []
        if not any(per_row):
            return logits, []
        rows: list[mx.array] = []
        contexts: list[mx.array] = []
        for e, processors in enumerate(per_row):
            row = logits[e : e + 1]
            if processors:
                context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                contexts.append(context)
                for processor in processors:
                    row = processor(context, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0), contexts


def ready_first_tokens(
    generator: BatchGenerator, uids: list[int]
) -> dict[int, tuple[int, mx.array]]:
    """The first token (and its logprobs row) of each of `uids` that has just joined the
    decode batch and not been handed out yet: the token mlx-lm's next step will return."""
    batch = generator._generation_batch
    if batch._next_tokens is None or not uids:
        return {}
    rows = {uid: i for i, uid in enumerate(batch.uids) if uid in uids}
    if not rows:
        return {}
    tokens: list[int] = batch._next_tokens.tolist()  # type: ignore[assignment]
    return {uid: (tokens[i], batch._next_logprobs[i]) for uid, i in rows.items()}


def _sampled(samplers: list[Any], logits: mx.array) -> tuple[mx.array, list[mx.array]]:
    """The rows' next tokens and the rows `Response.logprobs` carries: normalised, as mlx-lm
    does, except in an all-ARGMAX batch (raw logits, which nobody reads)."""
    if all(s is ARGMAX for s in samplers):
        return mx.argmax(logits, axis=-1), list(logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if all(s is samplers[0] for s in samplers):  # one batched call when the rows share one
        return samplers[0](logprobs), list(logprobs)
    rows = [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)]
    return mx.concatenate(rows, axis=0), list(logprobs)


class ExoPromptBatch(PromptProcessingBatch):
    """mlx-lm's prefill batch, whose prompts go on decoding in an `ExoGenerationBatch` (its
    constructor samples their first tokens, so the step there must be ours too)."""

    def generate(self, tokens: list[list[int]]) -> ExoGenerationBatch:
        # As mlx-lm's `generate`, with the decode batch's class changed.
        if any(len(t) > 1 for t in tokens):
            self.prompt([t[:-1] for t in tokens])
        generation = ExoGenerationBatch(
            self.model,
            self.uids,
            mx.array([t[-1] for t in tokens]),
            self.prompt_cache,
            self.tokens,
            self.samplers,
            self.fallback_sampler,
            self.logits_processors,
            self.stop_sequences,
            self.max_tokens,
        )
        self.uids, self.prompt_cache, self.tokens = [], [], []
        self.samplers, self.logits_processors, self.max_tokens = [], [], []
        return generation


def install(generator: BatchGenerator) -> BatchGenerator:
    """`generator` with its (still empty) decode batch replaced by an `ExoGenerationBatch`."""
    if len(generator._generation_batch) > 0:
        raise ValueError("the generator is already decoding")
    generator._generation_batch = ExoGenerationBatch.empty(generator.model, generator.sampler)
    generator._prompt_batch = ExoPromptBatch.empty(
        generator.model,
        generator.sampler,
        prefill_step_size=generator._prompt_batch.prefill_step_size,
    )
    return generator
