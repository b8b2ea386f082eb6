"""What a pipeline stage puts where a part of the model it does not run was: the received
hidden state in place of the embedding, no learned positions, and dropped parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn


class Received(nn.Module):
    """Stands in for the embedding on a rank after the first: "embedding" the tokens gives the
    hidden state the rank before sent. Keeps the real embedding only where it is also the
    head (tied weights on the last rank)."""

    def __init__(self, receive: Callable[[mx.array], mx.array], head: nn.Module | None) -> None:
        super().__init__()
        self._receive = receive  # a method, not a child module: no cycle in the tree
        if head is not None:
            self.head = head

    def __call__(self, inputs: mx.array) -> mx.array:
        return self._receive(inputs)

    def as_linear(self, x: mx.array) -> mx.array:
        head: Any = self.head  # an embedding (typed by duck: mlx's stubs lack as_linear)
        return head.as_linear(x)


class NoPositions(nn.Module):
    """A learned position embedding on a rank after the first: the received hidden state
    already has the positions added, so this adds nothing (a Python 0 keeps its dtype)."""

    def __call__(self, positions: mx.array) -> float:
        return 0.0


class Dropped(nn.Module):
    """A part this rank never runs (the head before the last rank): no weights kept."""

    def __call__(self, x: mx.array) -> mx.array:
        return x
