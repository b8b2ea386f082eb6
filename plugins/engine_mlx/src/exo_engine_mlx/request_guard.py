"""One request's failure inside a batch step fails that request only: its sampler and logits
processors run under a guard that records the exception against the request and lets the
step go on with a harmless stand-in (batching.py removes the sequence with an error after)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from exo_core.plugin import TaskId
from exo_engine_mlx.sampling import LogitsProcessor, Sampler, greedy


def restore_random_state(key: Any) -> None:
    """Give MLX's global random generator a valid key again after a sampler or processor
    failed. mlx-lm's samplers are compiled with the key as input and output: one that raises
    while being traced leaves a placeholder as the key, and every later unseeded sampling in
    this runner would then fail ("eval an array without a primitive"), not just the request
    that was wrong. MLX has no setter for the key: it is seeded from the key held before."""
    mx.random.seed(int(key[-1].item()))


def random_key() -> Any:
    """MLX's global random key (its stubs type `mx.random.state` as a plain object)."""
    state: Any = mx.random.state
    return state[0]


class RequestGuard:
    """Wraps one request's sampler and processors: an exception is recorded against the
    request, and a harmless value stands in for the result so the rest of the batch steps."""

    def __init__(self) -> None:
        self.failed: dict[TaskId, BaseException] = {}

    def sampler(self, task_id: TaskId, inner: Sampler) -> Sampler:
        def sample(logprobs: mx.array) -> mx.array:
            key = random_key()
            try:
                return inner(logprobs)
            except Exception as e:
                restore_random_state(key)
                self.failed.setdefault(task_id, e)
                return greedy(logprobs)

        return sample

    def processor(self, task_id: TaskId, inner: LogitsProcessor) -> LogitsProcessor:
        def process(tokens: mx.array, logits: mx.array) -> mx.array:
            key = random_key()
            try:
                return inner(tokens, logits)
            except Exception as e:
                restore_random_state(key)
                self.failed.setdefault(task_id, e)
                return logits

        return process
