"""`prefill_attention`: a prompt's attention as one tiled primitive, against MLX's own attention
on every path (AVX-512, AVX2, portable).

The kernel sums the scores in blocks of 64 keys with an online softmax: within 1e-5 of the
largest output of MLX's. Shapes cover SmolLM2's heads (9 over 3, 64 wide), a 1B's (4 per kv
head, 128 wide), widths that are not a multiple of 64 or 16, tails of tiles and key blocks, and
the masks the models hand over: "causal", mlx-lm's boolean batch masks (left padding), additive.
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np
import pytest

import exo_mlx_cpu_kernels as kernels

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernels not built: {kernels.UNAVAILABLE_REASON}"
)


@pytest.fixture(params=["simd", "avx2", "portable"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    kernels.force_avx2(request.param == "avx2")
    kernels.force_portable(request.param == "portable")
    yield str(request.param)
    kernels.force_avx2(False)
    kernels.force_portable(False)


def _random(*shape: int, seed: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed))


def _assert_near(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape
    top = float(np.abs(np.array(want)).max())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5 * top)


def _qkv(
    batch: int, heads: int, kv_heads: int, rows: int, keys: int, dim: int, seed: int
) -> tuple[mx.array, mx.array, mx.array]:
    """q laid out as the models make it (a transposed view), k and v as slices of a cache."""
    q = _random(batch, rows, heads, dim, seed=seed).transpose(0, 2, 1, 3)
    k = _random(batch, kv_heads, keys + 40, dim, seed=seed + 1)[..., :keys, :]
    v = _random(batch, kv_heads, keys + 40, dim, seed=seed + 2)[..., :keys, :]
    return q, k, v


def _batch_mask(batch: int, rows: int, keys: int) -> mx.array:
    """mlx-lm's BatchKVCache mask: causal, and each row's left padding hidden."""
    left = mx.array([(5 * b) % max(keys - rows, 1) for b in range(batch)])
    positions = mx.arange(keys)
    causal = mx.arange(keys - rows, keys)[:, None] >= positions[None, :]
    return causal[None, None] & (left[:, None, None, None] <= positions)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (4, 4, 80), (6, 3, 72)]
)
@pytest.mark.parametrize(("rows", "keys"), [(1, 1), (5, 5), (37, 100), (70, 70), (64, 330)])
def test_causal_matches_mlx(
    path: str, heads: int, kv_heads: int, dim: int, rows: int, keys: int
) -> None:
    q, k, v = _qkv(1, heads, kv_heads, rows, keys, dim, seed=rows + keys)
    scale = dim**-0.5
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    _assert_near(kernels.prefill_attention(q, k, v, scale, causal=True), want)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize(("rows", "keys"), [(3, 9), (40, 200)])
def test_masks_match_mlx(path: str, mask_kind: str, rows: int, keys: int) -> None:
    q, k, v = _qkv(3, 9, 3, rows, keys, 64, seed=7)
    allowed = _batch_mask(3, rows, keys)
    mask = {"none": None, "bool": allowed, "additive": mx.where(allowed, 0.0, -1e9)}[mask_kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    _assert_near(kernels.prefill_attention(q, k, v, 0.125, mask), want)


def test_an_additive_mask_is_added(path: str) -> None:
    q, k, v = _qkv(2, 9, 3, 20, 90, 64, seed=11)
    mask = _random(20, 90, seed=12) * 3.0  # one (L, N) mask broadcast over batch and heads
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    _assert_near(kernels.prefill_attention(q, k, v, 0.125, mask), want)


def test_a_row_with_every_key_hidden_gets_the_mean_of_the_values(path: str) -> None:
    """A left-padding row of a batch: finite, as MLX's softmax over equal scores makes it."""
    q, k, v = _qkv(1, 9, 3, 6, 150, 64, seed=13)
    allowed = mx.broadcast_to(mx.arange(6)[:, None] >= 2, (6, 150))  # rows 0-1 see nothing
    got = kernels.prefill_attention(q, k, v, 0.125, allowed)
    means = mx.repeat(v.mean(axis=2, keepdims=True), 3, axis=1)
    _assert_near(got[:, :, :2], mx.broadcast_to(means, (1, 9, 2, 64)))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=allowed)
    _assert_near(got[:, :, 2:], want[:, :, 2:])


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "kwargs", "message"),
    [
        ((1, 9, 4, 64), (1, 4, 5, 64), {}, "kv heads dividing"),
        ((1, 9, 4, 64), (1, 3, 0, 64), {}, "N >= 1"),
        ((1, 9, 8, 64), (1, 3, 5, 64), {"causal": True}, "N >= L"),
        ((1, 9, 4, 64), (1, 3, 5, 64), {"mask": mx.zeros((1, 9, 4, 5), mx.bool_)}, "every head"),
        ((1, 9, 4, 64), (1, 3, 5, 64), {"mask": mx.zeros((4, 5), mx.int32)}, "boolean"),
    ],
)
def test_bad_arguments_raise(
    q_shape: tuple[int, ...], kv_shape: tuple[int, ...], kwargs: dict[str, object], message: str
) -> None:
    q, kv = mx.zeros(q_shape), mx.zeros(kv_shape)
    with pytest.raises(ValueError, match=message):
        kernels.prefill_attention(q, kv, kv, 0.125, **kwargs)  # type: ignore[arg-type]
