"""`decode_attention`: a one-token step's grouped-head attention as one primitive, against
MLX's own attention, on both paths (AVX2 and portable).

MLX sums the dot products and the softmax in another order: within 1e-5 of the largest output.
A row's output must not depend on its batch nor on masked keys before its own (a batch's left
padding): that is compared bit for bit.
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

# SmolLM2-135M's attention: 9 query heads over 3 kv heads of 64.
HEADS, KV_HEADS, DIM = 9, 3, 64
SCALE = DIM**-0.5


@pytest.fixture(params=["simd", "portable"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    kernels.force_portable(request.param == "portable")
    yield str(request.param)
    kernels.force_portable(False)


def _normal(*shape: int, seed: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed))


def _cache_view(batch: int, keys: int, seed: int, capacity: int = 512) -> mx.array:
    """Keys or values as mlx-lm's caches hand them over: a slice of a longer buffer."""
    return _normal(batch, KV_HEADS, capacity, DIM, seed=seed)[..., :keys, :]


def _close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape
    scale = float(np.abs(np.array(want)).max())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5 * scale)


def _mask(kind: str, batch: int, keys: int) -> mx.array | None:
    left = mx.array([(3 * b) % max(keys // 2, 1) for b in range(batch)])
    allowed = left[:, None, None, None] <= mx.arange(keys)[None, None, None, :]
    return {"none": None, "bool": allowed, "additive": mx.where(allowed, 0.0, -mx.inf)}[kind]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("keys", [1, 7, 64, 300])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_matches_mlx_attention(path: str, batch: int, keys: int, mask_kind: str) -> None:
    q = _normal(batch, HEADS, 1, DIM, seed=keys)
    k, v = _cache_view(batch, keys, seed=1), _cache_view(batch, keys, seed=2)
    mask = _mask(mask_kind, batch, keys)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask)
    _close(kernels.decode_attention(q, k, v, SCALE, mask), want)


def test_additive_mask_values_are_added(path: str) -> None:
    q, k, v = _normal(2, HEADS, 1, DIM, seed=3), _cache_view(2, 50, 4), _cache_view(2, 50, 5)
    mask = _normal(1, 1, 1, 50, seed=6) * 4.0  # one row broadcast over the batch
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask)
    _close(kernels.decode_attention(q, k, v, SCALE, mask), want)


def test_any_strides(path: str) -> None:
    """Keys whose head dimension is not contiguous, values and queries transposed into place."""
    q = _normal(2, 1, HEADS, DIM, seed=7).swapaxes(1, 2)
    k = _normal(2, KV_HEADS, DIM, 33, seed=8).swapaxes(-1, -2)
    v = _normal(33, 2, KV_HEADS, DIM, seed=9).transpose(1, 2, 0, 3)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE)
    _close(kernels.decode_attention(q, k, v, SCALE), want)


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("keys", [45, 301])
@pytest.mark.parametrize("pad", range(1, 9))  # every shift of the keys against 8 lanes
def test_a_row_alone_equals_it_in_a_left_padded_batch(
    path: str, mask_kind: str, keys: int, pad: int
) -> None:
    q_row = _normal(1, HEADS, 1, DIM, seed=keys)
    k_row, v_row = _cache_view(1, keys, 11), _cache_view(1, keys, 12)
    alone = kernels.decode_attention(q_row, k_row, v_row, SCALE)
    # Row 1 of a batch of 3 whose longest sequence has `pad` more keys (its padding: any values).
    width = keys + pad
    q = mx.concatenate(
        [_normal(1, HEADS, 1, DIM, seed=13), q_row, _normal(1, HEADS, 1, DIM, seed=14)]
    )

    def batch_of(row: mx.array, seed: int) -> mx.array:
        padding = _normal(1, KV_HEADS, pad, DIM, seed=seed)
        others = [_cache_view(1, width, seed + s) for s in (1, 2)]
        return mx.concatenate([others[0], mx.concatenate([padding, row], 2), others[1]])

    k, v = batch_of(k_row, 15), batch_of(v_row, 18)
    starts = mx.array([0, pad, pad // 2])[:, None, None, None]
    allowed = starts <= mx.arange(width)[None, None, None, :]
    mask = allowed if mask_kind == "bool" else mx.where(allowed, 0.0, -mx.inf)
    batched = kernels.decode_attention(q, k, v, SCALE, mask)
    assert np.array_equal(np.array(batched[1:2]), np.array(alone))
    _close(batched, mx.fast.scaled_dot_product_attention(q, k, v, scale=SCALE, mask=mask))


@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "dtype", "mask", "message"),
    [
        ((1, 9, 2, 64), (1, 3, 5, 64), mx.float32, None, "q must be"),
        ((1, 9, 1, 64), (1, 4, 5, 64), mx.float32, None, "kv heads dividing"),
        ((1, 9, 1, 64), (1, 3, 5, 32), mx.float32, None, "kv heads dividing"),
        ((1, 9, 1, 64), (1, 3, 0, 64), mx.float32, None, "N >= 1"),
        ((1, 9, 1, 64), (1, 3, 5, 64), mx.float16, None, "float32"),
        ((1, 9, 1, 64), (1, 3, 5, 64), mx.float32, mx.zeros((1, 1, 1, 5), mx.int32), "boolean"),
    ],
)
def test_bad_arguments_raise(
    q_shape: tuple[int, ...],
    kv_shape: tuple[int, ...],
    dtype: mx.Dtype,
    mask: mx.array | None,
    message: str,
) -> None:
    q, kv = mx.zeros(q_shape, dtype), mx.zeros(kv_shape, dtype)
    with pytest.raises(ValueError, match=message):
        kernels.decode_attention(q, kv, kv, SCALE, mask)
