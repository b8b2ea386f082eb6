"""Test doubles built on the real engine: models whose output a test decides."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any
from unittest import mock

import mlx.core as mx

from exo_core.plugin import Chunk, FinishChunk, GenerationParams, TaskId, TextChunk

if TYPE_CHECKING:
    from exo_engine_mlx.batching import BatchEngine


class ScriptedOutput:
    """A real model whose every step's logits are replaced to pick the next scripted token:
    the batch engine, caches and sampling run for real on an output random weights never give."""

    def __init__(self, model: Any, prompt_length: int, script: list[int]) -> None:
        self._model = model
        self._script = script
        self._unseen_prompt = prompt_length

    @property
    def layers(self) -> Any:
        return self._model.layers

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        logits = self._model(inputs, cache=cache, **kwargs)
        # One sequence: the step's output is generated token number (tokens seen - prompt).
        self._unseen_prompt -= inputs.shape[1]
        step = max(0, -self._unseen_prompt)
        token = self._script[min(step, len(self._script) - 1)]
        vocab = mx.arange(logits.shape[-1])
        return mx.where(vocab == token, 0.0, -1e9).astype(logits.dtype) * mx.ones_like(logits)

    def expect(self, prompt_length: int, script: list[int]) -> None:
        """Script the next request (one sequence at a time)."""
        self._script = script
        self._unseen_prompt = prompt_length


def run_requests(
    engine: BatchEngine, requests: dict[str, GenerationParams], cancel_after: int | None = None
) -> dict[str, list[Chunk]]:
    """Every request submitted at once and the engine stepped until none is active: each
    request's chunks. With `cancel_after`, the first request is cancelled after that many
    steps."""
    out: dict[str, list[Chunk]] = {k: [] for k in requests}
    for task_id, p in requests.items():
        out[task_id].extend(engine.submit(TaskId(task_id), p))
    steps = 0
    while engine.active:
        if steps == cancel_after:
            first = next(iter(requests))
            out[first].extend(engine.cancel(TaskId(first)))
        for c in engine.step():
            out[c.task_id].append(c)
        steps += 1
    return out


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextChunk))


def finish_of(chunks: list[Chunk]) -> FinishChunk:
    last = chunks[-1]
    assert isinstance(last, FinishChunk), last
    return last


def float_activations() -> contextlib.AbstractContextManager[object]:
    """EXO_CPU_KERNELS=float for this process and the runners it starts, while inside.

    For tests of exact greedy text across paths that sum the same products in another order
    (a tensor split, the compiled step's folded norms): int8 activations (the default on VNNI
    CPUs) turn such last-bit differences into whole rounding steps of x, so their text agrees
    within the accuracy policy, not token for token."""
    return mock.patch.dict(os.environ, {"EXO_CPU_KERNELS": "float"})
