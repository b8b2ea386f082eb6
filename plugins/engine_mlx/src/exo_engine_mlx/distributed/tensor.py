"""Tensor parallel: every rank holds a slice of every layer (mlx-lm's `Model.shard`).

Attention heads and MLP columns are split over the ranks; the sharded-to-all projections sum
their partial outputs over the group, so every rank ends each layer with the same hidden state
and computes the same logits. Called on a lazily loaded model, only the slices are kept.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten


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


def dequantize_sharded(model: nn.Module) -> int:
    """Turn the quantized sharded projections into dense float32 ones, lazily.

    Done after sharding, only a rank's slices are ever dequantized: dequantizing first would
    materialize the whole dense model on every rank. Returns the number of layers replaced."""
    replaced: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.QuantizedAllToShardedLinear | nn.QuantizedShardedToAllLinear):
            continue
        biases: Any = m.get("biases")
        w = mx.dequantize(m.weight, m.scales, biases, m.group_size, m.bits, mode=m.mode).astype(
            mx.float32
        )
        n = m.group.size()
        out_dims, in_dims = w.shape
        has_bias = "bias" in m
        dense: nn.Module
        if isinstance(m, nn.QuantizedAllToShardedLinear):
            dense = nn.AllToShardedLinear(in_dims, out_dims * n, has_bias, group=m.group)
        else:
            dense = nn.ShardedToAllLinear(in_dims * n, out_dims, has_bias, group=m.group)
        # The constructors' random weights are lazy and replaced here: never computed.
        dense.weight = w
        if has_bias:
            dense.bias = m["bias"].astype(mx.float32)
        replaced.append((name, dense))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)
