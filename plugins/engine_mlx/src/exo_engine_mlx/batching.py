"""Continuous batching on mlx-lm's `BatchGenerator`.

`BatchEngine` is the runner's whole generation logic without any I/O: `submit` and `cancel`
take requests, `step` advances every active sequence by one token and returns the chunks to
send. Each sequence has its own sampler, logits processors, stop strings, streaming
detokenizer and statistics; a sequence joining mid-batch does not change the others' output.

A model whose cache the batch generator cannot batch (llama4, deepseek_v41) is served by
`generation_solo.SoloGenerator` instead, through the same interface: each request on its own
cache, stepped in turn, with every rule below unchanged (the prefix cache included: a finished
request's own cache is stored, and a new one starts from a copy of the longest stored prefix).

Fairness: a prompt is read `prefill_step_size` tokens a step (EXO_PREFILL_CHUNK, protocol.py),
and every step first decodes one token of each running stream (mlx-lm's `BatchGenerator._next`:
the decode batch, then one chunk of the prompt batch). A running stream therefore pauses for one
chunk at most while a long prompt arrives, and a request sent beside a long prompt joins its
prompt batch at the next chunk. (Prompts of a recurrent model are read one at a time: there a new
prompt waits for the one being read, though running streams still decode between its chunks.)

A failure while handling one request fails that request only: its sampler and logits
processors run under a guard that records the failure and lets the step go on, and the sequence
is then removed with an error. A step that fails as a whole (no request to blame) fails the
sequences of that batch and starts a fresh batch; the runner itself goes on either way.
"""

from __future__ import annotations

import resource
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from loguru import logger
from mlx_lm.generate import BatchGenerator

from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    KeepAliveChunk,
    TaskId,
    TextChunk,
    ThinkingChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from exo_core.plugin.parsers import OutputParser
from exo_engine_mlx.generation_batch import ARGMAX, ReadsLogprobs, install, ready_first_tokens
from exo_engine_mlx.generation_solo import SoloGenerator, can_batch, has_recurrent_state
from exo_engine_mlx.harmony_encoding import harmony_encoding, is_harmony
from exo_engine_mlx.output import family_parser
from exo_engine_mlx.prefill_threads import for_this_process
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.prompt import PromptError, encode, render
from exo_engine_mlx.protocol import PREFILL_CHUNK
from exo_engine_mlx.request_guard import RequestGuard
from exo_engine_mlx.sampling import (
    Sampler,
    ban_tokens,
    make_processors,
    make_sampler,
)
from exo_engine_mlx.textstream import TextStream

if TYPE_CHECKING:
    from exo_engine_mlx.vision.inputs import VisionInputs


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
    # The first token, handed out as the prompt ended (`ready_first_tokens`): mlx-lm's
    # response for it, a step later, only ends the sequence when it says so.
    early: int | None = None


def peak_memory_bytes() -> int:
    """The runner's peak memory: MLX's own peak, or the process's peak RSS when larger (on the
    CPU most of the model lives outside MLX's accounting)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return max(int(mx.get_peak_memory()), rss)


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


# What a caller is told when its request failed inside the runner (details go to the log).
REQUEST_FAILED = "the runner could not generate this request (see the node's log)"
STEP_FAILED = "a generation step failed; the requests in it were stopped (see the node's log)"


@dataclass(frozen=True)
class _EarlyToken:
    """A first token handed out before mlx-lm's response for it (`_early_tokens`)."""

    token: int
    logprobs: mx.array
    finish_reason: None = None


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
        context_length: int | None = None,
        prefill_step_size: int = PREFILL_CHUNK,
        recurrent: bool | None = None,
        batched: bool | None = None,
        vision: VisionInputs | None = None,
        early_first_token: bool = True,
    ) -> None:
        self.model = model
        # Hand a sequence's first token out in the step its prompt ends (not in a group: its
        # ranks step in lockstep on mlx-lm's own schedule).
        self._early_first_token = early_first_token
        self.vision = vision  # a vision model's images (vision/inputs.py); None: text only
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self.default_max_tokens = default_max_tokens
        self.context_length = context_length
        self._eos = {int(t) for t in tokenizer.eos_token_ids}
        if is_harmony(tokenizer):  # gpt-oss: openai-harmony's encoding takes ~1 s to load,
            harmony_encoding()  # better now than in the first request's time to first token
        self._prefill_step = prefill_step_size
        # `recurrent`: prefill prompts one at a time (None: the model says). The ranks of a
        # group must agree, so they pass the group's answer: a pipeline rank's slice may hold
        # no recurrent layer while another's does.
        if recurrent is None:
            recurrent = has_recurrent_state(model)
        prefill_batch = 1 if recurrent else max_concurrent
        # `batched`: through mlx-lm's batch generator, or one cache per request (None: the
        # model's caches say). A group passes its ranks' common answer, as for `recurrent`.
        self.batched = can_batch(model) if batched is None else batched
        stop_tokens = [[t] for t in sorted(self._eos)]
        self._new_generator: Callable[[], BatchGenerator | SoloGenerator] = lambda: (
            install(
                BatchGenerator(
                    model,
                    stop_tokens=stop_tokens,
                    completion_batch_size=max_concurrent,
                    prefill_batch_size=prefill_batch,
                    prefill_step_size=prefill_step_size,
                )
            )
            if self.batched
            else SoloGenerator(
                model,
                stop_tokens=stop_tokens,
                completion_batch_size=max_concurrent,
                prefill_step_size=prefill_step_size,
            )
        )
        self._generator = self._new_generator()
        self._blas_threads = for_this_process()
        self._guard = RequestGuard()
        self._by_uid: dict[int, _Sequence] = {}
        self._by_task: dict[TaskId, _Sequence] = {}

    @property
    def active(self) -> int:
        return len(self._by_uid)

    def task_ids(self) -> list[TaskId]:
        return list(self._by_task)

    def generated(self, task_id: TaskId) -> int:
        """Tokens a running request has generated so far (0 when it is not running)."""
        seq = self._by_task.get(task_id)
        return seq.generated if seq is not None else 0

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
            return self._submit(task_id, params)
        except PromptError as e:
            return [ErrorChunk(task_id=task_id, message=str(e))]
        except Exception as e:
            logger.opt(exception=e).error(f"request {task_id} failed to start")
            return [ErrorChunk(task_id=task_id, message=REQUEST_FAILED)]

    def _max_tokens(self, params: GenerationParams, prompt: int) -> int:
        """The answer's cap: the request's (or the default), within the room the prompt
        leaves in the model's context. Raises `PromptError` when it leaves none."""
        wanted = params.max_tokens or self.default_max_tokens
        if self.context_length is None:
            return wanted
        room = self.context_length - prompt
        if room < 1:
            raise PromptError(
                f"the prompt is {prompt} tokens, which leaves no room in the model's "
                f"context of {self.context_length} tokens"
            )
        return min(wanted, room)

    def _submit(self, task_id: TaskId, params: GenerationParams) -> list[Chunk]:
        if self.vision is None and any(m.has_images() for m in params.messages):
            raise PromptError("this model's images are not supported by the MLX engine yet")
        rendered = render(self.tokenizer, params, multimodal=self.vision is not None)
        tokens = encode(self.tokenizer, params, rendered)
        if self.vision is not None:
            tokens = self.vision.expand(tokens, params)
        if params.count_only:
            usage = Usage(prompt_tokens=len(tokens))
            return [FinishChunk(task_id=task_id, finish_reason=FinishReason.STOP, usage=usage)]
        max_tokens = self._max_tokens(params, len(tokens))
        sampler = self._sampler(task_id, params)
        wanted = make_processors(params.sampling, prompt_tokens=len(tokens))
        if params.ignore_eos:
            wanted.append(ban_tokens(sorted(self._eos)))
        if self.vision is not None:  # an image's ids are past the logits a penalty indexes
            wanted = [self.vision.processor(p) for p in wanted]
        processors = [self._guard.processor(task_id, p) for p in wanted]
        parser = family_parser(self.tokenizer, params, rendered)
        cache, cached = (None, 0)
        prefix_cache = self.prefix_cache
        if prefix_cache is not None and params.prefix_cache:
            cache, cached = prefix_cache.lookup(tokens)
        (uid,) = self._generator.insert(
            [tokens[cached:]],
            max_tokens=[max_tokens],
            caches=[cache] if cache is not None else None,
            all_tokens=[tokens[:cached]],
            samplers=[sampler],
            logits_processors=[processors],
        )
        seq = _Sequence(
            task_id=task_id,
            uid=uid,
            params=params,
            prompt=tokens,
            cached=cached,
            text=TextStream(self.tokenizer.detokenizer, params.stop),
            submitted=time.perf_counter(),
            parser=parser,
        )
        self._by_uid[uid] = seq
        self._by_task[task_id] = seq
        return []

    def _sampler(self, task_id: TaskId, params: GenerationParams) -> Sampler:
        # Greedy rows that read no logprobs share ARGMAX (one argmax for the batch, no
        # normalisation: generation_batch.py); an argmax cannot fail, so it needs no guard.
        if params.sampling.temperature == 0 and not params.logprobs:
            return ARGMAX
        sampler = self._guard.sampler(task_id, make_sampler(params.sampling))
        # Marked, so that a pipeline's ranks share this request's logprobs (only its).
        return ReadsLogprobs(sampler, params.top_logprobs) if params.logprobs else sampler

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
        try:
            prompt_responses, responses = self._next()
        except Exception as e:
            return self._fail_batch(e)
        out: list[Chunk] = [*self._prefill_progress(prompt_responses)]
        now = time.perf_counter()
        for r in responses:
            seq = self._by_uid.get(r.uid)
            if seq is None or seq.task_id in self._guard.failed:
                continue
            if seq.first_token_at is None:
                seq.first_token_at = now
            emitted, seq.early = seq.early is not None, None
            out.extend(self._token(seq, r, emitted=emitted))
        out.extend(self._early_tokens(prompt_responses))
        return [*out, *self._fail_guarded()]

    def _early_tokens(self, prompt_responses: list[Any]) -> list[Chunk]:
        """The first tokens of the prompts that ended in this step, handed out now (an
        end-of-sequence token waits for mlx-lm's response, which says whether it stops)."""
        generator = self._generator
        if not self._early_first_token or not isinstance(generator, BatchGenerator):
            return []
        ended = [r.uid for r in prompt_responses if r.end_of_prompt and r.uid in self._by_uid]
        out: list[Chunk] = []
        now = time.perf_counter()
        for uid, (token, logprobs) in ready_first_tokens(generator, ended).items():
            seq = self._by_uid.get(uid)
            if seq is None or token in self._eos or seq.task_id in self._guard.failed:
                continue
            seq.first_token_at = seq.first_token_at or now
            seq.early = token
            out.extend(self._token(seq, _EarlyToken(token, logprobs)))
        return out

    def _next(self) -> tuple[list[Any], list[Any]]:
        """The generator's step, with the prefill BLAS threads when it prefills prompts."""
        if self._blas_threads is None or not self._prefills():
            return self._generator.next()
        with self._blas_threads.prefilling():
            return self._generator.next()

    def _prefills(self) -> bool:
        generator = self._generator
        if isinstance(generator, SoloGenerator):
            return generator.prefilling
        return bool(generator._unprocessed_sequences) or len(generator._prompt_batch) > 0

    def _fail_guarded(self) -> list[Chunk]:
        """End the requests whose own sampler or processors failed in this step."""
        out: list[Chunk] = []
        for task_id, error in list(self._guard.failed.items()):
            del self._guard.failed[task_id]
            seq = self._by_task.get(task_id)
            if seq is None:
                continue
            logger.opt(exception=error).error(f"request {task_id} failed while sampling")
            self._generator.remove([seq.uid])
            self._forget(seq)
            out.append(ErrorChunk(task_id=task_id, message=REQUEST_FAILED))
        return out

    def _prefill_progress(self, responses: list[Any]) -> list[Chunk]:
        """A long prompt is prefilled a step at a time: say how far each one got (a prompt that
        fits one step says nothing)."""
        out: list[Chunk] = []
        for r in responses:
            seq = self._by_uid.get(r.uid)
            if seq is None or r.end_of_prompt or not isinstance(r.progress, tuple):
                continue
            done, total = r.progress
            if total <= self._prefill_step:
                continue
            out.append(
                KeepAliveChunk(
                    task_id=seq.task_id,
                    prefill_processed=seq.cached + int(done),
                    prefill_total=seq.cached + int(total),
                )
            )
        return out

    def _fail_batch(self, error: Exception) -> list[Chunk]:
        """A step failed with no request to blame: end every request in the batch and start
        a fresh batch, so the runner serves the next requests."""
        logger.opt(exception=error).error("a generation step failed")
        out: list[Chunk] = [
            ErrorChunk(task_id=seq.task_id, message=STEP_FAILED) for seq in self._by_uid.values()
        ]
        self._by_uid.clear()
        self._by_task.clear()
        self._guard.failed.clear()
        try:
            self._generator.close()
        except Exception as e:
            logger.opt(exception=e).warning("closing the failed batch failed")
        self._generator = self._new_generator()
        return out

    def _forget(self, seq: _Sequence) -> None:
        del self._by_uid[seq.uid]
        del self._by_task[seq.task_id]

    def _token(self, seq: _Sequence, r: Any, *, emitted: bool = False) -> list[Chunk]:
        """A response's token as chunks, and the sequence's end when it ends (`emitted`: its
        token was handed out already, `_early_tokens`)."""
        out: list[Chunk] = [] if emitted else self._text(seq, r)
        if seq.text.stopped:
            self._generator.remove([seq.uid])
            return [*out, *self._finish(seq, FinishReason.STOP, store=None)]
        if r.finish_reason is not None:
            reason = FinishReason.LENGTH if r.finish_reason == "length" else FinishReason.STOP
            store = (r.all_tokens, r.prompt_cache) if r.prompt_cache is not None else None
            return [*out, *self._finish(seq, reason, store=store)]
        return out

    def _text(self, seq: _Sequence, r: Any) -> list[Chunk]:
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
        self._forget(seq)
        prefix_cache = self.prefix_cache
        if store is not None and prefix_cache is not None and seq.params.prefix_cache:
            tokens, cache = store
            prefix_cache.store(tokens, cache)
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
            peak_memory_bytes=peak_memory_bytes(),
        )
        out.append(FinishChunk(task_id=seq.task_id, finish_reason=reason, usage=usage))
        return out

    def close(self) -> None:
        self._generator.close()
