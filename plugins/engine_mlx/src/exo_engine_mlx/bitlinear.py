"""BitNet's ternary layers where MLX has no Metal.

mlx-lm's `BitLinear` multiplies with a Metal kernel only (`mx.fast.metal_kernel`), so a BitNet
model cannot run on MLX's CPU back-end. Its weights are ternary, {-1, 0, 1} times one scale
per layer, four 2-bit codes a byte: the same values are exactly an MLX affine 8-bit layer with
codes {0, 1, 2}, every group's scale s and bias -s (s * q - s gives -s, 0 and s with no
rounding). As an ordinary `nn.QuantizedLinear` the layer then runs on exo's CPU kernels (or
MLX's quantized matmul) and splits like any quantized layer.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

GROUP_SIZES = (128, 64, 32)  # the largest that divides the input width is used
CODES_PER_BYTE = 4  # BitLinear packs four 2-bit codes into each uint8


def needs_conversion() -> bool:
    """Whether BitLinear cannot run here (no Metal back-end)."""
    return not mx.metal.is_available()


def unpack_ternary(packed: mx.array, out_features: int) -> mx.array:
    """BitLinear's packed [ceil(out/4), in] uint8 codes as [out, in] codes in {0, 1, 2}
    (weight = code - 1). Code k of row r belongs to output r + k * rows, as its kernel reads it."""
    fields = [(packed >> (2 * k)) & 3 for k in range(CODES_PER_BYTE)]
    return mx.concatenate(fields, axis=0)[:out_features]


def pack_int8_codes(codes: mx.array) -> mx.array:
    """[out, in] codes < 256 as MLX's 8-bit affine weight: [out, in / 4] uint32, the code of
    input j in bits 8 * (j % 4) of word j // 4."""
    out_features, in_features = codes.shape
    words = codes.astype(mx.uint32).reshape(out_features, in_features // 4, 4)
    shifts = mx.array([0, 8, 16, 24], dtype=mx.uint32)
    return (words << shifts).sum(axis=-1).astype(mx.uint32)


def _group_size(in_features: int) -> int | None:
    return next((g for g in GROUP_SIZES if in_features % g == 0), None)


def as_quantized_linear(layer: Any) -> nn.QuantizedLinear | None:
    """The 8-bit affine layer that computes what BitLinear `layer` computes; None when its
    input width fits no group size."""
    in_features, out_features = int(layer.in_features), int(layer.out_features)
    group_size = _group_size(in_features)
    if group_size is None:
        return None
    scale = layer.weight_scale.astype(mx.float32).reshape(())
    if layer.invert_weight_scales:  # the kernel divides by the stored scale
        scale = 1.0 / scale
    bias = layer.get("bias")
    quantized = nn.QuantizedLinear(
        in_features, out_features, bias=bias is not None, group_size=group_size, bits=8
    )
    codes = unpack_ternary(layer.weight, out_features)
    groups = (out_features, in_features // group_size)
    quantized.weight = pack_int8_codes(codes)
    quantized.scales = mx.broadcast_to(scale, groups)
    quantized.biases = mx.broadcast_to(-scale, groups)
    if bias is not None:
        quantized.bias = bias
    return quantized


def convert_bitlinear(model: nn.Module) -> int:
    """Replace every BitLinear of `model` by its 8-bit affine twin (lazily: nothing is read
    until evaluated). Returns how many were replaced. A layer no group size fits raises:
    it could not run here at all."""
    layers = sys.modules.get("mlx_lm.models.bitlinear_layers")
    if layers is None:  # building a model with BitLinear layers imports it: none here
        return 0
    BitLinear = layers.BitLinear

    replaced: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, BitLinear):
            twin = as_quantized_linear(module)
            if twin is None:
                raise ValueError(
                    f"{name}: BitLinear with {module.in_features} inputs (no group size of "
                    f"{GROUP_SIZES} divides it) needs Metal, which this machine lacks"
                )
            replaced.append((name, twin))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return len(replaced)
