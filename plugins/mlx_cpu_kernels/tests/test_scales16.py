"""Scales and biases in the 16 bits they came in (float16, bfloat16).

The kernels widen them to float32 as they read them. Every 16-bit value is exactly a float32,
so a layer's results must be bit for bit those of float32 copies of its scales, on every path
(AVX-512, AVX2, portable; one row, many rows, int8 activations, dequantize, fused_linear), and
the widening itself must give numpy's float32 value of every 16-bit pattern.
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

HALF = {"float16": mx.float16, "bfloat16": mx.bfloat16}


@pytest.fixture(params=["simd", "avx2", "portable"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    kernels.force_portable(request.param == "portable")
    kernels.force_avx2(request.param == "avx2")
    yield request.param
    kernels.force_portable(False)
    kernels.force_avx2(False)


def _all_finite_patterns(dtype: str) -> np.ndarray:
    """Every 16-bit pattern of `dtype` that is not a NaN, widened by numpy to float32."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    if dtype == "float16":
        values = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    else:
        values = (bits << 16).view(np.float32)
    return values[~np.isnan(values)]


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_widening_gives_numpys_float32_of_every_pattern(path: str, dtype: str) -> None:
    """dequantize with every weight q = 1 and bias 0 gives fma(1, scale, 0) = scale: the
    kernels' float32 of each 16-bit scale (zeros, subnormals, normals, infinities)."""
    expected = _all_finite_patterns(dtype)
    group_size = 32
    groups = 64
    n = -(-expected.size // groups)
    padded = np.zeros(n * groups, dtype=np.float32)
    padded[: expected.size] = expected
    scales = mx.array(padded.reshape(n, groups)).astype(HALF[dtype])
    biases = mx.zeros((n, groups), dtype=HALF[dtype])
    ones = mx.full((n, groups * group_size // 8), 0x11111111, dtype=mx.uint32)  # every q = 1
    got = np.array(kernels.dequantize(ones, scales, biases, group_size, 4))
    np.testing.assert_array_equal(got[:, ::group_size].reshape(-1)[: expected.size], expected)


def _layer(n: int, k: int, group_size: int, bits: int, dtype: str) -> tuple[mx.array, ...]:
    """A quantized layer whose scales and biases are exactly `dtype` values (as a GGUF's are)."""
    w = mx.random.normal((n, k), key=mx.random.key(n + k + bits))
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    return wq, scales.astype(HALF[dtype]), biases.astype(HALF[dtype])


def _f32(a: mx.array) -> mx.array:
    return a.astype(mx.float32)


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize(
    ("bits", "group_size", "k"),
    [(4, 32, 2048), (4, 64, 384), (4, 128, 384), (4, 32, 352), (8, 32, 352), (8, 64, 384)],
)
@pytest.mark.parametrize("rows", [1, 5])
def test_half_scales_give_the_float32_bits(
    path: str, dtype: str, int8: bool, bits: int, group_size: int, k: int, rows: int
) -> None:
    """Every kernel path: 16-bit scales give bit for bit the result of their float32 copies.
    203 weight rows: many widening steps of 4 rows and a tail of 3; 2048 wide: the 1B
    model's layers at Q4_0's group of 32."""
    wq, scales, biases = _layer(203, k, group_size, bits, dtype)
    x = mx.random.normal((rows, k), key=mx.random.key(rows))
    half = kernels.quantized_matmul(x, wq, scales, biases, group_size, bits, int8)
    full = kernels.quantized_matmul(x, wq, _f32(scales), _f32(biases), group_size, bits, int8)
    np.testing.assert_array_equal(np.array(half), np.array(full))


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_many_rows_and_threads_with_half_scales(dtype: str) -> None:
    """A prefill-sized call (70 rows, 600 weight rows over 1 and 3 threads: widening steps of
    256 rows inside each thread's chunks) equals float32 scales."""
    wq, scales, biases = _layer(600, 576, 32, 4, dtype)
    x = mx.random.normal((70, 576), key=mx.random.key(70))
    full = np.array(kernels.quantized_matmul(x, wq, _f32(scales), _f32(biases), 32, 4))
    try:
        for threads in (1, 3):
            kernels.set_num_threads(threads)
            half = kernels.quantized_matmul(x, wq, scales, biases, 32, 4)
            np.testing.assert_array_equal(np.array(half), full)
    finally:
        kernels.set_num_threads(kernels.usable_cores())


def test_dequantize_and_fused_linear_with_half_scales(path: str) -> None:
    wq, scales, biases = _layer(320, 256, 32, 4, "float16")
    dense = kernels.dequantize(wq, scales, biases, 32, 4)
    np.testing.assert_array_equal(
        np.array(dense), np.array(kernels.dequantize(wq, _f32(scales), _f32(biases), 32, 4))
    )
    x = mx.random.normal((1, 256), key=mx.random.key(3))
    norm = mx.random.uniform(shape=(256,), key=mx.random.key(4))
    ends = [128, 192, 320]
    norm_args = {"prologue": "rms_norm", "norm_weight": norm, "eps": 1e-5}
    half = kernels.fused_linear(x, wq, scales, biases, 32, 4, False, ends, **norm_args)
    full = kernels.fused_linear(x, wq, _f32(scales), _f32(biases), 32, 4, False, ends, **norm_args)
    for a, b in zip(half, full, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))


def test_mixed_scale_dtypes_take_float32() -> None:
    """float16 scales with float32 biases (or bfloat16 with float16): both are cast to float32,
    the values unchanged."""
    wq, scales, biases = _layer(64, 256, 32, 4, "float16")
    x = mx.random.normal((1, 256), key=mx.random.key(5))
    full = np.array(kernels.quantized_matmul(x, wq, _f32(scales), _f32(biases), 32, 4))
    for b in (_f32(biases), biases.astype(mx.bfloat16).astype(mx.float16)):
        got = np.array(kernels.quantized_matmul(x, wq, scales, b, 32, 4))
        ref = np.array(kernels.quantized_matmul(x, wq, _f32(scales), _f32(b), 32, 4))
        np.testing.assert_array_equal(got, ref)
    mixed = kernels.quantized_matmul(x, wq, scales, _f32(biases), 32, 4)
    np.testing.assert_array_equal(np.array(mixed), full)


def test_q4_0_bias_is_exact_in_float16() -> None:
    """Q4_0 stores a float16 scale d per 32 weights and means d * (q - 8): as MLX's affine
    layout, bias = -8 * d. Multiplying by 8 only moves the exponent, so the bias of every
    finite float16 scale below 65504 / 8 is itself an exact float16 (kept as 16 bits, the
    kernels see llama.cpp's bias exactly)."""
    d = _all_finite_patterns("float16")
    d = d[np.abs(d) <= np.float32(np.finfo(np.float16).max) / 8]
    bias = -8 * d  # float32: exact
    np.testing.assert_array_equal(bias.astype(np.float16).astype(np.float32), bias)
