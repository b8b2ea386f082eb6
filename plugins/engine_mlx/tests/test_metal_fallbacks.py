"""Muse Spark's Metal kernels as MLX ops (no Metal here): each fallback gives what the kernel's
Metal source computes, written out independently below with numpy, element by element in the
kernel's order (its float32 casts to T as bfloat16 rounding where T is bfloat16)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm import kernels

from exo_engine_mlx import metal_fallbacks as fb

F32 = np.float32
Round = Callable[[np.ndarray], np.ndarray]  # the kernel's static_cast<T>, on float32 values


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), kept as float32."""
    bits = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(F32)


def _to_t(dtype: mx.Dtype) -> Round:
    """The kernel's static_cast<T>, as a numpy function."""
    return _bf16 if dtype == mx.bfloat16 else (lambda x: np.asarray(x, F32))


def _input(rng: np.random.Generator, shape: tuple[int, ...], dtype: mx.Dtype) -> np.ndarray:
    """Random values exactly representable in dtype, as float32."""
    return _to_t(dtype)(rng.normal(size=shape).astype(F32) * 2)


def _mx(x: np.ndarray, dtype: mx.Dtype) -> mx.array:
    return mx.array(x).astype(dtype)


def _np(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def _close(got: mx.array, want: np.ndarray, dtype: mx.Dtype) -> None:
    # bfloat16 results may differ by one rounding step where float32 sums differ in order.
    tol = 1e-5 if dtype == mx.float32 else 2e-2
    np.testing.assert_allclose(_np(got), want, rtol=tol, atol=tol)


def test_every_kernel_muse_spark_calls_has_a_fallback_with_its_signature() -> None:
    assert set(fb.FALLBACKS) == set(kernels.__all__)
    for name, fallback in fb.FALLBACKS.items():
        kernel_params = inspect.signature(getattr(kernels, name)).parameters
        assert list(inspect.signature(fallback).parameters) == list(kernel_params), name


def test_install_puts_them_in_muse_spark_and_is_idempotent() -> None:
    import mlx_lm.models.muse_spark as muse_spark

    assert not mx.metal.is_available()
    assert fb.install() and fb.install()
    for name, fallback in fb.FALLBACKS.items():
        assert getattr(muse_spark, name) is fallback


# --- qk_norm and qk_norm_rope: one SIMD group per (token, q or k head) ---


def _ref_qk_heads(
    qkvg: np.ndarray, hq: int, hk: int, d: int, eps: float, scale: float, t: Round
) -> tuple[np.ndarray, np.ndarray]:
    tokens = qkvg.shape[:-1]
    flat = qkvg.reshape(-1, qkvg.shape[-1])
    q = np.zeros((flat.shape[0], hq, d), F32)
    k = np.zeros((flat.shape[0], hk, d), F32)
    for n in range(flat.shape[0]):
        for h in range(hq + hk):
            x = flat[n, h * d : (h + 1) * d].astype(np.float64)
            rstd = 1.0 / math.sqrt(float(np.sum(x * x)) / d + eps)
            y = t(x * rstd)
            if h < hq:
                q[n, h] = t(y * F32(scale))
            else:
                k[n, h - hq] = y
    return q.reshape(*tokens, hq, d), k.reshape(*tokens, hk, d)


def _ref_rope(y: np.ndarray, offsets: list[int], base: float, t: Round) -> np.ndarray:
    """y (B, L, H, D): element d of a head at position l + offset[b] (one offset: all rows)."""
    b_n, l_n, _, d_n = y.shape
    log2_base = F32(math.log2(base))
    out = np.zeros_like(y)
    for b in range(b_n):
        for i in range(l_n):
            pos = F32(i + offsets[b if len(offsets) > 1 else 0])
            for d in range(d_n):
                inv_freq = F32(2.0 ** (-(F32(d // 2) / F32(d_n // 2)) * log2_base))
                theta = float(pos * inv_freq)  # float32, as the kernel multiplies
                c, s = math.cos(theta), math.sin(theta)
                me, other = y[b, i, :, d], y[b, i, :, d ^ 1]
                out[b, i, :, d] = me * c - other * s if d % 2 == 0 else other * s + me * c
    return t(out)


QK_SHAPES = [
    # batch, tokens, q heads, kv heads, head_dim
    (1, 1, 4, 2, 16),
    (2, 5, 4, 2, 64),
    (1, 3, 3, 1, 48),  # head_dim not a multiple of 32: the last lanes idle
    (3, 2, 8, 8, 128),
]


@pytest.mark.parametrize("shape", QK_SHAPES)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_qk_norm(shape: tuple[int, ...], dtype: mx.Dtype) -> None:
    b, seq, hq, hk, d = shape
    rng = np.random.default_rng(sum(shape))
    qkvg = _input(rng, (b, seq, 2 * (hq + hk) * d), dtype)
    kw = {"n_heads": hq, "n_kv_heads": hk, "head_dim": d, "eps": 1e-5, "query_scale": 5.47}
    q, k = fb.qk_norm(_mx(qkvg, dtype), **kw)
    want_q, want_k = _ref_qk_heads(qkvg, hq, hk, d, 1e-5, 5.47, _to_t(dtype))
    assert q.dtype == k.dtype == dtype
    _close(q, want_q, dtype)
    _close(k, want_k, dtype)


@pytest.mark.parametrize("shape", QK_SHAPES)
@pytest.mark.parametrize("offset", [0, 37, [3, 0, 1000]])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_qk_norm_rope(shape: tuple[int, ...], offset: int | list[int], dtype: mx.Dtype) -> None:
    b, seq, hq, hk, d = shape
    offsets = [offset] if isinstance(offset, int) else offset[:b]
    if len(offsets) != 1 and len(offsets) != b:
        pytest.skip("one offset per batch row")
    rng = np.random.default_rng(sum(shape) + 1)
    qkvg = _input(rng, (b, seq, 2 * (hq + hk) * d), dtype)
    kw = {"n_heads": hq, "n_kv_heads": hk, "head_dim": d, "eps": 1e-6, "query_scale": 0.7}
    mx_offset = offset if isinstance(offset, int) else mx.array(offsets, dtype=mx.int32)
    q, k = fb.qk_norm_rope(_mx(qkvg, dtype), **kw, rope_base=500000.0, offset=mx_offset)
    t = _to_t(dtype)
    normed_q, normed_k = _ref_qk_heads(qkvg, hq, hk, d, 1e-6, 0.7, t)
    assert q.dtype == k.dtype == dtype
    _close(q, _ref_rope(normed_q, offsets, 500000.0, t), dtype)
    _close(k, _ref_rope(normed_k, offsets, 500000.0, t), dtype)


def test_qk_norm_rope_at_offset_zero_is_mlx_rope_of_qk_norm() -> None:
    """A second reading: the kernel says it rotates as mx.fast.rope(traditional=True)."""
    rng = np.random.default_rng(7)
    qkvg = mx.array(rng.normal(size=(1, 6, 2 * 6 * 32)).astype(F32))
    kw = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 32, "eps": 1e-6, "query_scale": 2.0}
    q, k = fb.qk_norm_rope(qkvg, **kw, rope_base=10000.0, offset=5)
    plain_q, plain_k = fb.qk_norm(qkvg, **kw)
    for got, plain in ((q, plain_q), (k, plain_k)):
        want = mx.fast.rope(
            plain.transpose(0, 2, 1, 3), 32, traditional=True, base=10000.0, scale=1.0, offset=5
        ).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


# --- rms_norm_sigmoid_gate: one SIMD group per (token, head) of the attention output ---


def _ref_norm_gate(x: np.ndarray, g: np.ndarray, eps: float, t: Round) -> np.ndarray:
    b_n, h_n, l_n, d = x.shape
    out = np.zeros((b_n, l_n, h_n * d), F32)
    for b in range(b_n):
        for i in range(l_n):
            for h in range(h_n):
                v = x[b, h, i].astype(np.float64)
                rstd = 1.0 / math.sqrt(float(np.sum(v * v)) / d + eps)
                sig = 1.0 / (1.0 + np.exp(-g[b, i, h * d : (h + 1) * d].astype(np.float64)))
                out[b, i, h * d : (h + 1) * d] = v * rstd * sig
    return t(out)


@pytest.mark.parametrize("shape", [(1, 4, 1, 16), (2, 4, 5, 64), (1, 3, 7, 48)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_rms_norm_sigmoid_gate(shape: tuple[int, ...], dtype: mx.Dtype) -> None:
    b, h, seq, d = shape
    rng = np.random.default_rng(sum(shape))
    # As the model passes them: x transposed from (B, L, H, D), the gate a slice of a wider row.
    x = _input(rng, (b, seq, h, d), dtype)
    row = _input(rng, (b, seq, 3 * h * d), dtype)
    gate = row[..., 2 * h * d :]
    got = fb.rms_norm_sigmoid_gate(
        _mx(x, dtype).transpose(0, 2, 1, 3), _mx(row, dtype)[..., 2 * h * d :], eps=1e-6
    )
    assert got.dtype == dtype and got.shape == (b, seq, h * d)
    _close(got, _ref_norm_gate(x.transpose(0, 2, 1, 3), gate, 1e-6, _to_t(dtype)), dtype)


# --- expert_routing: one SIMD group per token ---


def _ref_routing(
    logits: np.ndarray, bias: np.ndarray, k: int, mult: float, eps: float, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    flat = logits.reshape(-1, logits.shape[-1])
    n, e_n = flat.shape
    inds = np.zeros((n, k), np.uint32)
    weights = np.zeros((n, k), F32)
    for row in range(n):
        x = flat[row].astype(F32) * F32(mult)
        score = (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)
        biased = score + bias
        w = []
        for j in range(k):
            best = max(biased)
            winner = min(e for e in range(e_n) if biased[e] == best)  # ties: the lower expert
            inds[row, j] = winner
            w.append(score[winner])
            biased[winner] = -np.inf
        total = F32(0)
        for wk in w:
            total = F32(wk + total)
        weights[row] = [F32(wk / F32(total + F32(eps))) * F32(scale) for wk in w]
    shape = (*logits.shape[:-1], k)
    return inds.reshape(shape), weights.reshape(shape)


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k"), [((1, 1), 4, 1), ((2, 3), 8, 2), ((1, 5), 40, 4), ((7,), 64, 8)]
)
@pytest.mark.parametrize("ties", [False, True])
def test_expert_routing(tokens: tuple[int, ...], experts: int, top_k: int, ties: bool) -> None:
    rng = np.random.default_rng(experts + top_k)
    logits = rng.normal(size=(*tokens, experts)).astype(F32) * 3
    bias = rng.normal(size=experts).astype(F32) * 0.1
    if ties:  # few distinct scores and no bias: most choices are between equal experts
        logits, bias = np.round(logits).astype(F32), np.zeros_like(bias)
    kw = {"top_k": top_k, "multiplier": 1.3, "score_eps": 1e-15, "route_scale": 2.5}
    inds, weights = fb.expert_routing(mx.array(logits), mx.array(bias), **kw)
    want_inds, want_weights = _ref_routing(logits, bias, top_k, 1.3, 1e-15, 2.5)
    assert inds.dtype == mx.uint32 and weights.dtype == mx.float32
    np.testing.assert_array_equal(np.array(inds), want_inds)
    np.testing.assert_allclose(np.array(weights), want_weights, rtol=1e-5, atol=1e-6)


# --- norm_add_norm and pre_norm: one threadgroup per token ---


def _ref_rms(v: np.ndarray, eps: float) -> np.ndarray:
    v = v.astype(np.float64)
    return v / np.sqrt(np.sum(v * v, axis=-1, keepdims=True) / v.shape[-1] + eps)


def _ref_norm_add_norm(
    branch: np.ndarray,
    stream: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    post_w: np.ndarray | None,
    post_eps: float,
    pre: tuple[np.ndarray, float] | None,
    t: Round,
) -> tuple[np.ndarray, np.ndarray | None]:
    new_stream = np.zeros(stream.shape, F32)
    normed = np.zeros(branch.shape, F32)
    flat_b, flat_s = branch.reshape(-1, branch.shape[-1]), stream.reshape(-1, stream.shape[-1])
    for row in range(flat_b.shape[0]):
        v = flat_b[row].astype(F32)
        if post_w is not None:
            v = t(t(post_w) * v)  # the weight scales the input, in T
        n = t(_ref_rms(v, post_eps))
        s = (alpha * flat_s[row] + beta * n).astype(F32)
        new_stream.reshape(-1, s.shape[-1])[row] = s
        if pre is not None:
            normed.reshape(-1, s.shape[-1])[row] = t(_ref_rms(s, pre[1]) * pre[0])
    return new_stream, (normed if pre is not None else None)


@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 3, 96), (1, 4, 1000)])
@pytest.mark.parametrize("post_scale", [False, True])
@pytest.mark.parametrize("next_norm", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_norm_add_norm(
    shape: tuple[int, ...], post_scale: bool, next_norm: bool, dtype: mx.Dtype
) -> None:
    d = shape[-1]
    rng = np.random.default_rng(d + post_scale + 2 * next_norm)
    branch = _input(rng, shape, dtype)
    stream = rng.normal(size=shape).astype(F32) * 5
    alpha = rng.uniform(0.5, 1.5, d).astype(F32)
    beta = rng.uniform(0.1, 1.0, d).astype(F32)
    post_w = rng.uniform(0.5, 2.0, d).astype(F32) if post_scale else None
    norm = nn.RMSNorm(d, eps=1e-5)
    norm.weight = mx.array(rng.uniform(0.5, 2.0, d).astype(F32))
    got_stream, got_normed = fb.norm_add_norm(
        _mx(branch, dtype),
        mx.array(stream),
        alpha=mx.array(alpha),
        beta=mx.array(beta),
        post_weight=None if post_w is None else mx.array(post_w),
        post_eps=1e-6,
        next_norm=norm if next_norm else None,
    )
    pre = (np.array(norm.weight), 1e-5) if next_norm else None
    t = _to_t(dtype)
    want_stream, want_normed = _ref_norm_add_norm(branch, stream, alpha, beta, post_w, 1e-6, pre, t)
    assert got_stream.dtype == mx.float32 and got_stream.shape == shape
    # The stream is float32 from T values: one rounding of n away in bfloat16 at most.
    _close(got_stream, want_stream, dtype)
    if not next_norm:
        assert got_normed is None
        return
    assert got_normed is not None and got_normed.dtype == dtype and want_normed is not None
    _close(got_normed, want_normed, dtype)
    # pre_norm alone, on that stream, gives the same normed values.
    alone = fb.pre_norm(got_stream, norm, dtype=dtype)
    assert alone.dtype == dtype
    np.testing.assert_array_equal(_np(alone), _np(got_normed))


@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 2, 200)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_pre_norm(shape: tuple[int, ...], dtype: mx.Dtype) -> None:
    rng = np.random.default_rng(shape[-1])
    stream = rng.normal(size=shape).astype(F32) * 3
    norm = nn.RMSNorm(shape[-1], eps=1e-4)
    norm.weight = mx.array(rng.uniform(-2.0, 2.0, shape[-1]).astype(F32))
    got = fb.pre_norm(mx.array(stream), norm, dtype=dtype)
    want = _to_t(dtype)(_ref_rms(stream, 1e-4) * np.array(norm.weight))
    assert got.dtype == dtype
    _close(got, want, dtype)


# --- post_expert_norm_combine: one threadgroup per token, its K expert rows ---


def _ref_combine(
    experts: np.ndarray, weights: np.ndarray, norm_w: np.ndarray, eps: float, t: Round
) -> np.ndarray:
    *lead, k_n, d = experts.shape
    flat_x, flat_w = experts.reshape(-1, k_n, d), weights.reshape(-1, k_n)
    out = np.zeros((flat_x.shape[0], d), F32)
    for row in range(flat_x.shape[0]):
        acc = np.zeros(d, F32)
        for k in range(k_n):
            v = flat_x[row, k].astype(np.float64) * norm_w  # the weight scales the input
            inv = 1.0 / math.sqrt(float(np.sum(v * v)) / d + eps)
            acc = t(acc + v * inv * float(t(flat_w[row, k])))  # rounded after each add
        out[row] = acc
    return t(out).reshape(*lead, d)


@pytest.mark.parametrize("shape", [(1, 1, 1, 32), (2, 3, 4, 64), (1, 5, 8, 200)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_post_expert_norm_combine(shape: tuple[int, ...], dtype: mx.Dtype) -> None:
    *lead, k, d = shape
    rng = np.random.default_rng(k * d)
    experts = _input(rng, shape, dtype)
    weights = rng.uniform(0.0, 1.0, (*lead, k)).astype(F32)
    norm_w = rng.uniform(0.5, 2.0, d).astype(F32)
    got = fb.post_expert_norm_combine(
        _mx(experts, dtype), mx.array(weights), norm_weight=mx.array(norm_w), eps=1e-5
    )
    assert got.dtype == dtype and got.shape == (*lead, d)
    want = _ref_combine(experts, weights, norm_w, 1e-5, _to_t(dtype))
    _close(got, want, dtype)
