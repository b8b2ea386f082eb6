"""Continuous batching on mlx-lm's `BatchGenerator`.

`BatchEngine` is the runner's whole generation logic without any I/O: `submit` and `cancel`
take requests, `step` advances every active sequence by one token and returns the chunks to
send. Each sequence has its own sampler, logits processors, stop strings, streaming
detokenizer and statistics; a sequence joining mid-batch does not change the others' output.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from exo_core.generation import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    TextChunk,
    ThinkingChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from exo_core.ids import TaskId
from exo_core.parsers import OutputParser
from exo_engine_mlx.output import family_parser
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.prompt import PromptError, encode, render
from exo_engine_mlx.sampling import make_processors, make_sampler
from exo_engine_mlx.textstream import TextStream


@dataclass
class _Sequence:
    task_id: TaskId
    uid: int
    params: GenerationParams
    prompt: list[int]
    cached: int
    text: TextStream
    submitted: float
    # The family's thinking and tool-call format (None: plain text).
    parser: OutputParser | None = None
    first_token_at: float | None = None
    generated: int = 0
    reasoning: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)


def _parsed(seq: _Sequence, text: str) -> list[Chunk]:
    """New text of a sequence as chunks: through the family's parser when it has one."""
    chunk = TextChunk(task_id=seq.task_id, text=text, logprobs=tuple(seq.pending_logprobs))
    return seq.parser.feed(chunk) if seq.parser is not None else [chunk]


def _thinking(seq: _Sequence, chunks: list[Chunk]) -> bool:
    """Whether the token just added was thinking: it gave thinking text, or it is held inside
    an open think block (a token with no text of its own yet counts with the block)."""
    if any(isinstance(c, ThinkingChunk) for c in chunks):
        return True
    return seq.parser is not None and seq.parser.thinking


def _rate(count: int, seconds: float) -> float:
    # A request so short that its time rounds to zero reports no rate rather than crashing.
    return count / seconds if seconds > 0 else 0.0


class BatchEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_concurrent: int = 8,
        prefix_cache: PrefixCache | None = None,
        default_max_tokens: int = 2048,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self.default_max_tokens = default_max_tokens
        self._eos = {int(t) for t in tokenizer.eos_token_ids}
        self._generator = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(self._eos)],
            completion_batch_size=max_concurrent,
            prefill_batch_size=max_concurrent,
        )
        self._by_uid: dict[int, _Sequence] = {}
        self._by_task: dict[TaskId, _Sequence] = {}

    @property
    def active(self) -> int:
        return len(self._by_uid)

    def task_ids(self) -> list[TaskId]:
        return list(self._by_task)

    def fingerprint(self) -> int:
        """A digest of the batch (tasks, tokens generated, prefix reuse): ranks of a group that
        run in step have equal fingerprints after every step."""
        state = sorted(
            (s.task_id, s.generated, s.cached, len(s.prompt)) for s in self._by_uid.values()
        )
        return zlib.crc32(repr(state).encode())

    def submit(self, task_id: TaskId, params: GenerationParams) -> list[Chunk]:
        """Queue a request. Returns chunks at once only when it is refused."""
        try:
            rendered = render(self.tokenizer, params)
            tokens = encode(self.tokenizer, params, rendered)
        except PromptError as e:
            return [ErrorChunk(task_id=task_id, message=str(e))]
        cache, cached = (None, 0)
        if self.prefix_cache is not None:
            cache, cached = self.prefix_cache.lookup(tokens)
        max_tokens = params.max_tokens or self.default_max_tokens
        (uid,) = self._generator.insert(
            [tokens[cached:]],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[tokens[:cached]],
            samplers=[make_sampler(params.sampling)],
            logits_processors=[make_processors(params.sampling)],
        )
        seq = _Sequence(
            task_id=task_id,
            uid=uid,
            params=params,
            prompt=tokens,
            cached=cached,
            text=TextStream(self.tokenizer.detokenizer, params.stop),
            submitted=time.perf_counter(),
            parser=family_parser(self.tokenizer, params, rendered),
        )
        self._by_uid[uid] = seq
        self._by_task[task_id] = seq
        return []

    def cancel(self, task_id: TaskId) -> list[Chunk]:
        seq = self._by_task.get(task_id)
        if seq is None:
            return []
        self._generator.remove([seq.uid])
        return self._finish(seq, FinishReason.CANCELLED, store=None)

    def step(self) -> list[Chunk]:
        """Advance every sequence by one step (a prefill chunk or one token)."""
        if not self._by_uid:
            return []
        _, responses = self._generator.next()
        out: list[Chunk] = []
        now = time.perf_counter()
        for r in responses:
            seq = self._by_uid.get(r.uid)
            if seq is None:
                continue
            if seq.first_token_at is None:
                seq.first_token_at = now
            out.extend(self._token(seq, r))
        return out

    def _token(self, seq: _Sequence, r: Any) -> list[Chunk]:
        token = int(r.token)
        is_eos = token in self._eos and r.finish_reason == "stop"
        if not is_eos:
            seq.generated += 1
        text = "" if is_eos else seq.text.add(token)
        if seq.params.logprobs and not is_eos:
            seq.pending_logprobs.append(self._logprob(token, r.logprobs, seq.params.top_logprobs))
        out: list[Chunk] = []
        if text:
            out.extend(_parsed(seq, text))
            seq.pending_logprobs.clear()
        if not is_eos and _thinking(seq, out):
            seq.reasoning += 1
        if seq.text.stopped:
            self._generator.remove([seq.uid])
            return [*out, *self._finish(seq, FinishReason.STOP, store=None)]
        if r.finish_reason is not None:
            reason = FinishReason.LENGTH if r.finish_reason == "length" else FinishReason.STOP
            store = (r.all_tokens, r.prompt_cache) if r.prompt_cache is not None else None
            return [*out, *self._finish(seq, reason, store=store)]
        return out

    def _logprob(self, token: int, logprobs: mx.array, top: int) -> TokenLogprob:
        decode = self.tokenizer.decode
        alternatives: tuple[TopLogprob, ...] = ()
        if top > 0:
            ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
            values = logprobs[ids]
            order = mx.argsort(-values)
            top_ids: list[int] = ids[order].tolist()  # type: ignore[assignment]
            top_values: list[float] = values[order].tolist()  # type: ignore[assignment]
            alternatives = tuple(
                TopLogprob(decode([i]), v) for i, v in zip(top_ids, top_values, strict=True)
            )
        return TokenLogprob(token=decode([token]), logprob=float(logprobs[token]), top=alternatives)

    def _finish(
        self, seq: _Sequence, reason: FinishReason, store: tuple[list[int], list[Any]] | None
    ) -> list[Chunk]:
        del self._by_uid[seq.uid]
        del self._by_task[seq.task_id]
        if store is not None and self.prefix_cache is not None:
            tokens, cache = store
            self.prefix_cache.store(tokens, cache)
        out: list[Chunk] = []
        tail = seq.text.finish()
        if tail:
            out.extend(_parsed(seq, tail))
        if seq.parser is not None:
            out.extend(seq.parser.finish(seq.task_id))
        now = time.perf_counter()
        first = seq.first_token_at or now
        usage = Usage(
            prompt_tokens=len(seq.prompt),
            completion_tokens=seq.generated,
            cached_tokens=seq.cached,
            reasoning_tokens=seq.reasoning,
            prompt_tps=_rate(len(seq.prompt) - seq.cached, first - seq.submitted),
            generation_tps=_rate(max(0, seq.generated - 1), now - first),
            time_to_first_token_s=first - seq.submitted,
        )
        out.append(FinishChunk(task_id=seq.task_id, finish_reason=reason, usage=usage))
        return out

    def close(self) -> None:
        self._generator.close()
