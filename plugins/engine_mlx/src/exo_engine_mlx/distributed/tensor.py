"""Tensor parallel: every rank holds a slice of every layer (mlx-lm's `Model.shard`).

Attention heads and MLP columns are split over the ranks; the sharded-to-all projections sum
their partial outputs over the group, so every rank ends each layer with the same hidden state
and computes the same logits. Called on a lazily loaded model, only the slices are kept.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn


class TensorUnsupported(ValueError):
    """The model cannot be split over this many ranks."""


def _heads(model: nn.Module) -> tuple[int, int]:
    args: Any = getattr(model, "args", None)
    heads = int(getattr(args, "num_attention_heads", 0) or 0)
    kv = int(getattr(args, "num_key_value_heads", 0) or heads)
    return heads, kv


def shard_tensor(model: nn.Module, group: mx.distributed.Group) -> None:
    """Shard `model` in place over `group`; raises `TensorUnsupported` with the reason."""
    size = group.size()
    if not callable(getattr(model, "shard", None)):
        model_type = getattr(model, "model_type", "?")
        raise TensorUnsupported(f"model type '{model_type}' has no tensor-parallel split")
    heads, kv = _heads(model)
    if heads and heads % size:
        raise TensorUnsupported(f"{heads} attention heads do not divide by {size} ranks")
    if kv and kv % size:
        raise TensorUnsupported(f"{kv} KV heads do not divide by {size} ranks")
    model.shard(group)  # type: ignore[attr-defined]
