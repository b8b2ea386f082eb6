"""Muse Spark's fused kernels as plain MLX ops, where MLX has no Metal.

mlx-lm's `muse_spark` calls seven kernels of `mlx_lm/kernels/` (built with
`mx.fast.metal_kernel`, no fallback), so the family cannot run on MLX's CPU back-end. Each
function here has the kernel function's signature and does the kernel's arithmetic: sums and
norms in float32, and a rounding to the kernel's element type `T` exactly where the Metal source
casts to `T` (a no-op for float32 models, a bfloat16 rounding for bfloat16 ones). `install()`
puts them in the names `muse_spark` imported. What differs is float32 rounding, not
arithmetic: the order of a reduction's sums (SIMD sums there), fused multiply-adds the Metal
compiler may make, and the last bits of exp, cos, sin and rsqrt (Metal's fast variants).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

F32 = mx.float32


def _round(x: mx.array, dtype: mx.Dtype) -> mx.array:
    """`static_cast<T>` then back to float, as the kernels round intermediates."""
    return x.astype(dtype).astype(F32)


def _rstd(v: mx.array, eps: float) -> mx.array:
    """rsqrt(sum(v^2) / D + eps) over the last axis of float32 `v`, kept for broadcasting."""
    return mx.rsqrt(mx.sum(v * v, axis=-1, keepdims=True) / v.shape[-1] + eps)


def _normed_heads(
    qkvg: mx.array, n_heads: int, n_kv_heads: int, head_dim: int, eps: float, query_scale: float
) -> tuple[mx.array, mx.array]:
    """The q and k heads of each qkvg row (its first (HQ + HK) * D values), each head rms-normed
    without a weight and rounded to T; q also times query_scale, rounded again. float32."""
    dtype = qkvg.dtype
    heads = n_heads + n_kv_heads
    v = qkvg[..., : heads * head_dim].reshape(*qkvg.shape[:-1], heads, head_dim).astype(F32)
    y = _round(v * _rstd(v, eps), dtype)
    q = _round(y[..., :n_heads, :] * query_scale, dtype)
    return q, y[..., n_heads:, :]


def qk_norm(
    qkvg: mx.array,
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    query_scale: float,
) -> list[mx.array]:
    """q (..., n_heads, head_dim) and k (..., n_kv_heads, head_dim), in qkvg's dtype."""
    q, k = _normed_heads(qkvg, n_heads, n_kv_heads, head_dim, eps, query_scale)
    return [q.astype(qkvg.dtype), k.astype(qkvg.dtype)]


def _positions(tokens: tuple[int, ...], offset: int | mx.array) -> mx.array:
    """Each token's position as the kernel computes it: its index in the last token axis plus
    the offset of its row (one offset, or one per row of the leading axes), added as unsigned
    32-bit integers (a negative offset wraps as the kernel's does), then as float32."""
    seq_len = tokens[-1]
    rows = math.prod(tokens[:-1])
    if isinstance(offset, mx.array):
        offsets = offset.reshape(-1).astype(mx.int32)
    else:
        offsets = mx.array([offset], dtype=mx.int32)
    per_row = offsets if offsets.size > 1 else mx.broadcast_to(offsets, (rows,))
    index = mx.arange(seq_len, dtype=mx.uint32)
    pos = index[None, :] + per_row.astype(mx.uint32)[:, None]
    return pos.reshape(tokens).astype(F32)


def _rotate_pairs(y: mx.array, pos: mx.array, log2_base: mx.array) -> mx.array:
    """mx.fast.rope(traditional=True)'s rotation of float32 y (..., tokens, heads, D) at
    pos (tokens): pair (2j, 2j + 1) by pos * base^(-j / (D / 2)), D / 2 in integers."""
    half = y.shape[-1] // 2
    inv_freq = mx.power(mx.array(2.0, dtype=F32), -(mx.arange(half, dtype=F32) / half) * log2_base)
    theta = pos[..., None, None] * inv_freq  # (..., 1, D / 2): the same for every head
    c, s = mx.cos(theta), mx.sin(theta)
    pairs = y.reshape(*y.shape[:-1], half, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return mx.stack([even * c - odd * s, even * s + odd * c], axis=-1).reshape(y.shape)


def qk_norm_rope(
    qkvg: mx.array,
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    query_scale: float,
    rope_base: float,
    offset: int | mx.array,
) -> list[mx.array]:
    """qk_norm, then the traditional rotation of the rounded q and k at positions offset,
    offset + 1, ... (an int, or one offset per batch row); in qkvg's dtype."""
    dtype = qkvg.dtype
    q, k = _normed_heads(qkvg, n_heads, n_kv_heads, head_dim, eps, query_scale)
    pos = _positions(qkvg.shape[:-1], offset)
    # The kernel gets the log2 of the base as a float32 constant, as mx.fast.rope takes it.
    log2_base = mx.array(math.log2(rope_base), dtype=F32)
    return [
        _rotate_pairs(q, pos, log2_base).astype(dtype),
        _rotate_pairs(k, pos, log2_base).astype(dtype),
    ]


def rms_norm_sigmoid_gate(x: mx.array, gate: mx.array, *, eps: float) -> mx.array:
    """rms_norm(x) * sigmoid(gate) per head in float32, rounded once: x (B, H, L, D), gate
    (B, L, H * D), the result (B, L, H * D) in x's dtype."""
    B, H, L, D = x.shape
    v = x.transpose(0, 2, 1, 3).astype(F32)  # (B, L, H, D), the gate's order
    sig = 1.0 / (1.0 + mx.exp(-gate.reshape(B, L, H, D).astype(F32)))
    return (v * _rstd(v, eps) * sig).reshape(B, L, H * D).astype(x.dtype)


def expert_routing(
    logits: mx.array,
    expert_bias: mx.array,
    *,
    top_k: int,
    multiplier: float,
    score_eps: float,
    route_scale: float,
) -> list[mx.array]:
    """The top_k experts of each token by sigmoid score plus bias (ties: the lower expert),
    best first, as uint32; their unbiased scores over their sum (plus score_eps) times
    route_scale, float32."""
    E = logits.shape[-1]
    x = logits.astype(F32) * mx.array(multiplier, dtype=F32)
    y = 1.0 / (1.0 + mx.exp(mx.abs(x)))  # sigmoid, without overflow either side
    score = mx.where(x < 0, y, 1.0 - y)
    biased = score + expert_bias.astype(F32)
    experts = mx.arange(E, dtype=mx.uint32)
    inds: list[mx.array] = []
    picked: list[mx.array] = []
    for _ in range(top_k):
        top = mx.max(biased, axis=-1, keepdims=True)
        winner = mx.min(mx.where(biased == top, experts, E), axis=-1, keepdims=True)
        chosen = experts == winner
        picked.append(mx.sum(mx.where(chosen, score, 0.0), axis=-1))
        inds.append(winner[..., 0])
        biased = mx.where(chosen, -mx.inf, biased)
    total = mx.zeros_like(picked[0])
    for w in picked:  # in the kernel's order: total = w[k] + total
        total = w + total
    eps = mx.array(score_eps, dtype=F32)
    scale = mx.array(route_scale, dtype=F32)
    weights = [w / (total + eps) * scale for w in picked]
    return [mx.stack(inds, axis=-1).astype(mx.uint32), mx.stack(weights, axis=-1)]


def _pre_normed(s: mx.array, weight: mx.array, eps: float, dtype: mx.Dtype) -> mx.array:
    """The fp32 stream s rms-normed with weight (read as float32), rounded to dtype."""
    return (s * _rstd(s, eps) * weight.astype(F32)).astype(dtype)


def norm_add_norm(
    branch: mx.array,
    stream: mx.array,
    *,
    alpha: mx.array,
    beta: mx.array,
    post_weight: mx.array | None,
    post_eps: float,
    next_norm: nn.RMSNorm | None,
) -> tuple[mx.array, mx.array | None]:
    """The branch post-normed (its weight scaling the input, in T), added to the fp32 stream
    as alpha * stream + beta * normed, and that sum pre-normed with next_norm.
    Returns the new stream (float32) and the normed sum in the branch's dtype (None without
    next_norm)."""
    dtype = branch.dtype
    v = branch.astype(F32)
    if post_weight is not None:
        v = _round(_round(post_weight, dtype) * v, dtype)
    n = _round(v * _rstd(v, post_eps), dtype)
    s = alpha.astype(F32) * stream.astype(F32) + beta.astype(F32) * n
    if next_norm is None:
        return s, None
    return s, _pre_normed(s, next_norm.weight, next_norm.eps, dtype)


def pre_norm(stream: mx.array, norm: nn.RMSNorm, *, dtype: mx.Dtype) -> mx.array:
    """The fp32 stream pre-normed with norm as norm_add_norm does, in dtype."""
    return _pre_normed(stream.astype(F32), norm.weight, norm.eps, dtype)


def post_expert_norm_combine(
    experts: mx.array, weights: mx.array, *, norm_weight: mx.array, eps: float
) -> mx.array:
    """Each expert output (..., K, D) times norm_weight, rms-normed, times its routing weight
    (rounded to T), added in expert order into a sum rounded to T after each add; (..., D)."""
    dtype = experts.dtype
    v = experts.astype(F32) * norm_weight.astype(F32)
    normed = v * _rstd(v, eps)
    ew = _round(weights, dtype)
    acc = mx.zeros(normed.shape[:-2] + normed.shape[-1:], dtype=F32)
    for k in range(experts.shape[-2]):
        acc = _round(acc + normed[..., k, :] * ew[..., k, None], dtype)
    return acc.astype(dtype)


FALLBACKS: dict[str, Callable[..., Any]] = {
    "expert_routing": expert_routing,
    "norm_add_norm": norm_add_norm,
    "post_expert_norm_combine": post_expert_norm_combine,
    "pre_norm": pre_norm,
    "qk_norm": qk_norm,
    "qk_norm_rope": qk_norm_rope,
    "rms_norm_sigmoid_gate": rms_norm_sigmoid_gate,
}


def install() -> bool:
    """Where MLX has no Metal, make `mlx_lm.models.muse_spark` call these (it bound the kernel
    functions by name at import; it looks them up when it runs). Only a loaded module is
    patched: building a Muse Spark model imports it, and no other model needs it. Idempotent.
    Returns whether they are installed."""
    muse_spark = sys.modules.get("mlx_lm.models.muse_spark")
    if muse_spark is None or mx.metal.is_available():
        return False

    for name, fallback in FALLBACKS.items():
        setattr(muse_spark, name, fallback)
    return True
