"""The kernels against MLX's own dequantize + matmul on random weights.

Tolerance: float32 sums in another order; the error stays below 1e-5 of the largest output
(measured ~1e-6), asserted as rtol 1e-4 / atol 1e-3 on outputs of magnitude ~10-100.
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
    """The widest path of this CPU (AVX-512 where present), AVX2 alone, and the portable one."""
    kernels.force_portable(request.param == "portable")
    kernels.force_avx2(request.param == "avx2")
    yield request.param
    kernels.force_portable(False)
    kernels.force_avx2(False)


def _quantized(n: int, k: int, group_size: int, bits: int) -> tuple[mx.array, ...]:
    w = mx.random.normal((n, k), key=mx.random.key(n * k + bits))
    return mx.quantize(w, group_size=group_size, bits=bits)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_matches_dequantize_matmul(path: str, bits: int, group_size: int, rows: int) -> None:
    wq, scales, biases = _quantized(200, 384, group_size, bits)
    x = mx.random.normal((rows, 384), key=mx.random.key(rows))
    expected = x @ mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits).T
    got = kernels.quantized_matmul(x, wq, scales, biases, group_size, bits)
    assert got.dtype == mx.float32 and got.shape == (rows, 200)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_matches_mlx(path: str, bits: int) -> None:
    wq, scales, biases = _quantized(96, 256, 64, bits)
    expected = mx.dequantize(wq, scales, biases, group_size=64, bits=bits)
    got = kernels.dequantize(wq, scales, biases, 64, bits)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-6, atol=1e-5)


def test_batch_dims_half_scales_and_threads() -> None:
    """Leading dims are kept; fp16 scales and a transposed x are handled; threads agree."""
    wq, scales, biases = _quantized(4096, 256, 32, 4)
    x = mx.random.normal((256, 6), key=mx.random.key(1)).T.reshape(2, 3, 256)
    expected = x @ mx.dequantize(wq, scales, biases, group_size=32, bits=4).T
    outs = []
    for threads in (1, 3):
        kernels.set_num_threads(threads)
        outs.append(np.array(kernels.quantized_matmul(x, wq, scales, biases, 32, 4)))
    kernels.set_num_threads(kernels.usable_cores())
    assert outs[0].shape == (2, 3, 4096)
    np.testing.assert_array_equal(outs[0], outs[1])  # rows are split, never a sum
    np.testing.assert_allclose(outs[0], np.array(expected), rtol=1e-4, atol=1e-3)
    half = kernels.quantized_matmul(
        x, wq, scales.astype(mx.float16), biases.astype(mx.float16), 32, 4
    )
    assert half.dtype == mx.float32


@pytest.mark.parametrize(
    ("k", "group_size", "bits", "message"),
    [(384, 48, 4, "group_size"), (384, 32, 3, "bits"), (256, 32, 4, "last dimension")],
)
def test_bad_arguments_raise(k: int, group_size: int, bits: int, message: str) -> None:
    wq, scales, biases = _quantized(8, 384, 32, 4)
    with pytest.raises(ValueError, match=message):
        kernels.quantized_matmul(mx.zeros((1, k)), wq, scales, biases, group_size, bits)


# ---------------------------------------------------------------- int8 activations


def _int8_reference(
    x: mx.array, wq: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """(what the int8 path must compute, its worst-case distance from the exact product).

    x is rounded per block of 32 to dx * round(x / dx), dx = max|x| / 127 (ties to even, as
    the kernel), against the centred weights s (q - c); the bias term (b + c s) sum(x) is
    exact. The bound: each value of x moves by at most dx / 2."""
    xs = np.array(x, dtype=np.float32)
    rows, k = xs.shape
    blocks = xs.reshape(rows, k // 32, 32)
    dx = (np.abs(blocks).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), dx, out=np.zeros_like(dx), where=dx > 0)
    x8 = (np.rint(blocks * inv) * dx).reshape(rows, k)
    c = 2 ** (bits - 1)
    s, b = np.array(scales, np.float32), np.array(biases, np.float32)
    bias = np.repeat(b + c * s, group_size, axis=1)
    centred = np.array(mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits)) - bias
    xsum = xs.reshape(rows, k // group_size, group_size).sum(-1)
    expected = x8 @ centred.T + xsum @ (b + c * s).T
    worst = (np.repeat(dx[..., 0], 32, axis=1) / 2) @ np.abs(centred).T
    return expected, worst


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 3, 45])  # 45: two row tiles (40 rows of 384 per tile)
def test_int8_activations_match_their_definition(
    path: str, bits: int, group_size: int, rows: int
) -> None:
    wq, scales, biases = _quantized(200, 384, group_size, bits)
    x = mx.random.normal((rows, 384), key=mx.random.key(rows)) * 3
    x = mx.concatenate([mx.zeros((rows, 32)), x[:, 32:]], axis=1)  # an all-zero block: dx = 0
    expected, worst = _int8_reference(x, wq, scales, biases, group_size, bits)
    got = kernels.quantized_matmul(x, wq, scales, biases, group_size, bits, int8_activations=True)
    assert got.dtype == mx.float32 and got.shape == (rows, 200)
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-4, atol=1e-3)
    # And the honest distance from the exact product: never beyond the rounding bound.
    exact = np.array(x @ mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits).T)
    assert np.all(np.abs(np.array(got) - exact) <= worst + 1e-3)


def test_int8_activations_keep_batch_dims_and_agree_across_threads() -> None:
    wq, scales, biases = _quantized(4096, 256, 32, 8)
    x = mx.random.normal((256, 6), key=mx.random.key(2)).T.reshape(2, 3, 256)
    outs = []
    for threads in (1, 3):
        kernels.set_num_threads(threads)
        got = kernels.quantized_matmul(x, wq, scales, biases, 32, 8, int8_activations=True)
        outs.append(np.array(got))
    kernels.set_num_threads(kernels.usable_cores())
    assert outs[0].shape == (2, 3, 4096)
    np.testing.assert_array_equal(outs[0], outs[1])
    expected, _ = _int8_reference(x.reshape(6, 256), wq, scales, biases, 32, 8)
    np.testing.assert_allclose(outs[0].reshape(6, 4096), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize(
    ("bits", "group_size", "k"),
    # 4 bits at every group size (AVX-512 folds two groups of 32 into one vector), and a width
    # that 64 does not divide (352: 4 bits take the AVX2 path on every CPU, 8 bits AVX-512).
    # 576 and 1216: VNNI's superblocks of 512 and units of 64 after them (384: units alone).
    [
        (4, 32, 384),
        (4, 64, 384),
        (4, 128, 384),
        (4, 32, 352),
        (8, 32, 352),
        (8, 64, 384),
        (4, 32, 576),
        (4, 64, 1216),
    ],
)
def test_rows_give_the_same_bits_alone_and_in_a_batch(
    path: str, bits: int, group_size: int, k: int, int8: bool
) -> None:
    """Batched decode must equal solo decode: a row's result never depends on its neighbours
    (nor on the weight rows it is computed with: 203 is not a multiple of 4), and the layers
    fused into one call give each layer's own bits (tail of 3 rows below)."""
    wq, scales, biases = _quantized(203, k, group_size, bits)
    x = mx.random.normal((9, k), key=mx.random.key(9))
    batch = np.array(kernels.quantized_matmul(x, wq, scales, biases, group_size, bits, int8))
    for row in range(9):
        one = x[row : row + 1]
        alone = kernels.quantized_matmul(one, wq, scales, biases, group_size, bits, int8)
        np.testing.assert_array_equal(np.array(alone)[0], batch[row])
        tail = kernels.quantized_matmul(
            one, wq[200:], scales[200:], biases[200:], group_size, bits, int8
        )
        np.testing.assert_array_equal(np.array(tail)[0], batch[row, 200:])
    dense = x @ mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits).T
    tolerance = 5e-2 if int8 else 1e-3  # int8 rounds x (its own test holds it to its definition)
    np.testing.assert_allclose(batch, np.array(dense), rtol=tolerance, atol=tolerance * 50)


@pytest.mark.parametrize(("bits", "group_size"), [(4, 32), (8, 32), (4, 64), (4, 128), (8, 64)])
def test_many_rows_give_each_row_its_own_bits(path: str, bits: int, group_size: int) -> None:
    """The many-rows kernel (tiles of 32 rows of 1536 here: 70 = 2 tiles + 6, blocks of 4 rows
    + a tail of 2) gives every row the bits of that row alone, and the dense product's values."""
    wq, scales, biases = _quantized(67, 1536, group_size, bits)
    x = mx.random.normal((70, 1536), key=mx.random.key(70))
    batch = np.array(kernels.quantized_matmul(x, wq, scales, biases, group_size, bits))
    for row in (0, 3, 4, 31, 32, 33, 63, 64, 69):
        alone = kernels.quantized_matmul(x[row : row + 1], wq, scales, biases, group_size, bits)
        np.testing.assert_array_equal(np.array(alone)[0], batch[row])
    for rows in (2, 3, 5, 8):  # decode batches: one block, or a block and a tail
        part = kernels.quantized_matmul(x[:rows], wq, scales, biases, group_size, bits)
        np.testing.assert_array_equal(np.array(part), batch[:rows])
    dense = x @ mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits).T
    np.testing.assert_allclose(batch, np.array(dense), rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------- int8 activations on VNNI


@pytest.mark.skipif(not kernels.vnni(), reason="this CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 6, 45])  # one row; a few; many, one left after the pairs
@pytest.mark.parametrize("half", [False, True])  # float16 scales are read in place
@pytest.mark.parametrize(
    ("bits", "k"),
    # 4 bits: superblocks of 512 alone; 2 superblocks + 6 units of 64. 8 bits: units of 64.
    [(4, 512), (4, 1408), (8, 1408)],
)
def test_vnni_int8_equals_the_avx2_int8_kernel(
    group_size: int, rows: int, half: bool, bits: int, k: int
) -> None:
    """The VNNI kernel computes the AVX2 int8 kernel's integers (centred weights against the
    same int8 x) and differs only in the order of the float sums after: within 1e-5 of the
    largest output of it, and both within the int8 path's definition."""
    wq, scales, biases = _quantized(203, k, group_size, bits)  # 203: a tail of 3 weight rows
    if half:
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    x = mx.random.normal((rows, k), key=mx.random.key(rows + 100)) * 3
    x = mx.concatenate([mx.zeros((rows, 32)), x[:, 32:]], axis=1)  # an all-zero block: dx = 0
    vnni = np.array(kernels.quantized_matmul(x, wq, scales, biases, group_size, bits, True))
    kernels.force_no_vnni(True)
    try:
        assert not kernels.vnni()
        avx2 = np.array(kernels.quantized_matmul(x, wq, scales, biases, group_size, bits, True))
    finally:
        kernels.force_no_vnni(False)
    assert kernels.vnni()
    np.testing.assert_allclose(vnni, avx2, rtol=0, atol=1e-5 * np.abs(avx2).max())
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    expected, _ = _int8_reference(x, wq, s32, b32, group_size, bits)
    np.testing.assert_allclose(vnni, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not kernels.vnni(), reason="this CPU has no AVX-512 VNNI")
def test_vnni_one_row_over_large_weights_gives_its_bits_in_a_batch() -> None:
    """A one-row call over 16 MB of weights streams them a row at a time, two superblocks in
    flight (`kStreamBytes`); a batch goes through transposed tiles, 2 rows of x against 4
    weight rows: the same bits."""
    wq, scales, biases = _quantized(16387, 2048, 32, 4)  # 16 MB, and a tail of 3 rows
    x = mx.random.normal((3, 2048), key=mx.random.key(3))
    batch = np.array(kernels.quantized_matmul(x, wq, scales, biases, 32, 4, True))
    for row in range(3):
        alone = kernels.quantized_matmul(x[row : row + 1], wq, scales, biases, 32, 4, True)
        np.testing.assert_array_equal(np.array(alone)[0], batch[row])


def test_forcing_avx2_turns_vnni_off() -> None:
    kernels.force_avx2(True)
    try:
        assert not kernels.vnni()
    finally:
        kernels.force_avx2(False)
