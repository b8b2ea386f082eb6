"""Test doubles built on the real engine: models whose output a test decides."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


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
