"""Attention of a one-token step with grouped query heads, cheaper on the CPU.

On the CPU `mx.fast.scaled_dot_product_attention` runs MLX's fallback graph: with grouped query
heads it broadcasts the keys and values over each group's query heads and multiplies one query
row at a time (batch x query heads matrix-vector products through the BLAS, each with its own
call overhead and packing). With one new token per sequence the query heads of a group can be
the rows of one product instead: batch x kv heads products of (heads per group x head dim).
Each score is the same dot product, the mask, the softmax and the weighted sum are MLX's
fallback's own ops in the same order, so the output equals the fast path's (measured bit for
bit on SmolLM2's shapes; tests hold it to float32 rounding). On SmolLM2 (9 query heads, 3 kv
heads) at 8 rows this takes ~40 % less CPU than the fast path (bench/profiles/batch8_step_smollm2.txt).

Where exo's CPU kernels are built, a float32 step on the CPU runs all of that as one primitive
(`exo_mlx_cpu_kernels.decode_attention`: the same arithmetic, equal up to float32 rounding, a
row's output independent of its batch) instead of ~8-10 MLX ops a layer: on SmolLM2 at 8 rows
and 72 keys, 30 layers' attention took 5.7 ms of CPU instead of 16.1 (bench/profile_batch_step.py
section 2, loaded 2-core machine).
EXO_FUSED_ATTENTION=auto (default) | off: the MLX ops below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import mlx.core as mx

import exo_mlx_cpu_kernels as kernels

_OFF = ("off", "0", "no", "false")


def fused_attention_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether a foldable step may run its attention as the kernels' one primitive."""
    env = os.environ if env is None else env
    return env.get("EXO_FUSED_ATTENTION", "auto").strip().lower() not in _OFF


def _foldable(q: mx.array, k: mx.array, mask: mx.array | str | None) -> bool:
    """One new token, grouped heads, and a mask (if any) that is the same for every head."""
    if isinstance(mask, str) or q.ndim != 4 or q.shape[2] != 1 or k.shape[1] == q.shape[1]:
        return False
    if q.shape[1] % k.shape[1] != 0:
        return False
    return mask is None or (mask.ndim == 4 and mask.shape[1] == 1 and mask.shape[2] == 1)


def _kernel_covers(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None) -> bool:
    """float32 on the CPU with a boolean or float32 mask (or none), the kernels built and wanted."""
    return (
        q.dtype == k.dtype == v.dtype == mx.float32
        and (mask is None or mask.dtype in (mx.bool_, mx.float32))
        and mx.default_device() == mx.cpu
        and kernels.available()
        and fused_attention_requested()
    )


def decode_attention(
    q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: mx.array | str | None
) -> mx.array:
    """softmax(q k^T * scale + mask) v for q (B, heads, 1, D), k and v (B, kv heads, N, D), a
    boolean or additive mask broadcastable to (B, 1, 1, N) or None: one kernel primitive where
    `_kernel_covers` it, else the MLX ops. Other shapes take MLX's fast path."""
    if not _foldable(q, k, mask) or isinstance(mask, str):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    if _kernel_covers(q, k, v, mask):
        return kernels.decode_attention(q, k, v, scale, mask)
    batch, heads, _, dim = q.shape
    kv_heads = k.shape[1]
    grouped = (q * mx.array(scale, q.dtype)).reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = grouped @ k.swapaxes(-1, -2)
    if mask is not None:
        if mask.dtype == mx.bool_:
            lowest = mx.array(mx.finfo(scores.dtype).min, scores.dtype)
            scores = mx.where(mask, scores, lowest)
        else:
            scores = scores + mask
    weights = mx.softmax(scores, axis=-1, precise=True)
    return (weights @ v).reshape(batch, heads, 1, v.shape[-1])
