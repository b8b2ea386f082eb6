"""Q4_0's layout without stored biases (`quantized_matmul(..., biases=None, ...)`).

Q4_0 means d * (q - 8) per 32 weights: as MLX's affine layout every bias is -8 x its scale, so
a layer can leave its biases out and read 4.5 bits a weight instead of 5. The kernels then take
-8 x each widened scale (or, on VNNI, drop the bias term, which is 0): the result must be bit
for bit that of the stored biases -8 * scales on every path (AVX-512, VNNI, AVX2, portable; one
row, many rows, float or int8 activations, 1 or several threads).
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


@pytest.fixture(params=["simd", "no-vnni", "avx2", "portable"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    kernels.force_portable(request.param == "portable")
    kernels.force_avx2(request.param == "avx2")
    kernels.force_no_vnni(request.param == "no-vnni")
    yield request.param
    kernels.force_portable(False)
    kernels.force_avx2(False)
    kernels.force_no_vnni(False)


def _q4_0_layer(n: int, k: int, group_size: int, dtype: str) -> tuple[mx.array, mx.array]:
    """Random 4-bit codes and 16-bit scales (the bias is implied: -8 x scale)."""
    key = mx.random.key(n + k)
    codes = mx.random.randint(0, 1 << 16, (n, k // 8, 2), key=key).astype(mx.uint32)
    words = codes[..., 0] | (codes[..., 1] << 16)
    scales = mx.random.uniform(-0.02, 0.02, (n, k // group_size), key=key).astype(HALF[dtype])
    return words, scales


def _stored_bias(scales: mx.array) -> mx.array:
    """Q4_0's bias as a stored array: exact in 16 bits (test_scales16's q4_0 test)."""
    return (-8 * scales.astype(mx.float32)).astype(scales.dtype)


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize(("group_size", "k"), [(32, 2048), (64, 384), (32, 352)])
@pytest.mark.parametrize("rows", [1, 5])
def test_left_out_biases_give_the_stored_biases_bits(
    path: str, dtype: str, int8: bool, group_size: int, k: int, rows: int
) -> None:
    """203 weight rows (blocks of 4 and a tail of 3); K = 352 is not a multiple of 64 (no
    AVX-512/VNNI 4-bit kernel: the widening path)."""
    wq, scales = _q4_0_layer(203, k, group_size, dtype)
    x = mx.random.normal((rows, k), key=mx.random.key(rows))
    implied = kernels.quantized_matmul(x, wq, scales, None, group_size, 4, int8)
    stored = kernels.quantized_matmul(x, wq, scales, _stored_bias(scales), group_size, 4, int8)
    np.testing.assert_array_equal(np.array(implied), np.array(stored))


def test_left_out_biases_match_the_dense_reference() -> None:
    """Against numpy: x @ (scale * (q - 8)).T."""
    wq, scales = _q4_0_layer(96, 256, 32, "float16")
    x = mx.random.normal((3, 256), key=mx.random.key(9))
    dense = np.array(kernels.dequantize(wq, scales, _stored_bias(scales), 32, 4))
    q = np.array(kernels.dequantize(wq, mx.ones_like(scales), mx.zeros_like(scales), 32, 4))
    s = np.repeat(np.array(scales.astype(mx.float32)), 32, axis=1)
    np.testing.assert_array_equal(dense, s * (q - 8))
    got = np.array(kernels.quantized_matmul(x, wq, scales, None, 32, 4))
    np.testing.assert_allclose(got, np.array(x) @ dense.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int8", [False, True])
def test_left_out_biases_over_threads(int8: bool) -> None:
    wq, scales = _q4_0_layer(600, 512, 32, "float16")
    x = mx.random.normal((9, 512), key=mx.random.key(70))
    stored = np.array(kernels.quantized_matmul(x, wq, scales, _stored_bias(scales), 32, 4, int8))
    try:
        for threads in (1, 3):
            kernels.set_num_threads(threads)
            for m in (1, 9):
                got = kernels.quantized_matmul(x[:m], wq, scales, None, 32, 4, int8)
                np.testing.assert_array_equal(np.array(got), stored[:m])
    finally:
        kernels.set_num_threads(kernels.usable_cores())


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
def test_fused_linear_with_left_out_biases(path: str, int8: bool, rows: int) -> None:
    """The decode step's fused calls (norm before, residual after, split parts) take the layout
    too, with the stored biases' bits."""
    wq, scales = _q4_0_layer(320, 256, 32, "float16")
    x = mx.random.normal((rows, 256), key=mx.random.key(3))
    weight = mx.random.uniform(shape=(256,), key=mx.random.key(4))
    residual = mx.ones((rows, 320))

    def fused(biases: mx.array | None) -> list[np.ndarray]:
        normed = kernels.fused_linear(
            x, wq, scales, biases, 32, 4, int8, [128, 192, 320],
            prologue="rms_norm", norm_weight=weight, eps=1e-5,
        )  # fmt: skip
        added = kernels.fused_linear(x, wq, scales, biases, 32, 4, int8, [320], residual=residual)
        return [np.array(a) for a in [*normed, *added]]

    for a, b in zip(fused(None), fused(_stored_bias(scales)), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("bits", "dtype"), [(8, mx.float16), (4, mx.float32)], ids=["8-bit", "float32-scales"]
)
def test_left_out_biases_need_4_bits_and_16_bit_scales(bits: int, dtype: mx.Dtype) -> None:
    w = mx.zeros((8, 64 * bits // 32), dtype=mx.uint32)
    scales = mx.ones((8, 2), dtype=dtype)
    with pytest.raises(ValueError, match="biases may be left out"):
        kernels.quantized_matmul(mx.ones((1, 64)), w, scales, None, 32, bits)
    with pytest.raises(ValueError, match="biases may be left out"):
        kernels.fused_linear(mx.ones((1, 64)), w, scales, None, 32, bits, False, [8])
