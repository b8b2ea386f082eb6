"""BitNet's ternary layers as 8-bit affine layers (no Metal here): the same outputs as the
arithmetic of mlx-lm's Metal kernel, written out independently below with numpy."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.bitlinear_layers import BitLinear

from exo_engine_mlx.bitlinear import as_quantized_linear, convert_bitlinear


def _kernel_reference(
    x: np.ndarray, packed: np.ndarray, scale: float, invert: bool, out: int
) -> np.ndarray:
    """What bitlinear_matmul computes: byte (r, i) holds the codes of outputs r, r + rows,
    r + 2 rows, r + 3 rows at input i, weight = code - 1, times the scale (or over it)."""
    rows, width = packed.shape
    w = np.zeros((rows * 4, width), np.float64)
    for r in range(rows):
        for k in range(4):
            w[r + k * rows] = ((packed[r] >> (2 * k)) & 3).astype(np.float64) - 1
    y = x.astype(np.float64) @ w[:out].T
    return y / scale if invert else y * scale


def _layer(
    in_features: int, out_features: int, *, invert: bool, bias: bool, seed: int
) -> BitLinear:
    rng = np.random.default_rng(seed)
    layer = BitLinear(in_features, out_features, bias=bias, invert_weight_scales=invert)
    rows = (out_features + 3) // 4
    codes = rng.integers(0, 3, (4, rows, in_features))
    packed = np.zeros((rows, in_features), np.uint8)
    for k in range(4):
        packed |= (codes[k] << (2 * k)).astype(np.uint8)
    layer.weight = mx.array(packed)
    layer.weight_scale = mx.array([rng.uniform(0.3, 3.0)], dtype=mx.float32)
    if bias:
        layer.bias = mx.array(rng.normal(size=out_features).astype(np.float32))
    return layer


@pytest.mark.parametrize("in_features", [32, 64, 96, 256])
@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_the_8bit_twin_computes_what_the_metal_kernel_does(
    in_features: int, invert: bool, bias: bool
) -> None:
    out_features = 12
    layer = _layer(in_features, out_features, invert=invert, bias=bias, seed=in_features)
    twin = as_quantized_linear(layer)
    assert isinstance(twin, nn.QuantizedLinear) and twin.bits == 8
    x = np.random.default_rng(1).normal(size=(3, in_features)).astype(np.float32)
    want = _kernel_reference(
        x, np.array(layer.weight), float(np.array(layer.weight_scale)[0]), invert, out_features
    )
    if bias:
        want = want + np.array(layer.bias)
    got = np.array(twin(mx.array(x)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_model_keeps_no_bitlinear_and_a_width_no_group_fits_is_refused() -> None:
    model = nn.Sequential(_layer(64, 8, invert=False, bias=False, seed=0), nn.ReLU())
    assert convert_bitlinear(model) == 1
    assert isinstance(model.layers[0], nn.QuantizedLinear)
    odd = nn.Sequential(_layer(48, 8, invert=False, bias=False, seed=0))
    with pytest.raises(ValueError, match="48 inputs"):
        convert_bitlinear(odd)
