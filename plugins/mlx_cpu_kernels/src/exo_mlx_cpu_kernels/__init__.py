"""Vectorised, multi-threaded affine quantized matmul for MLX on the CPU (an MLX primitive).

MLX's own CPU quantized matmul is scalar and single-threaded. This one (AVX-512 or AVX2+FMA
when the CPU has them, a portable loop otherwise, its own threads over the output rows) computes
`x @ dequantize(w, scales, biases, group_size, bits).T` in float32 for MLX's affine 4- and
8-bit layouts with groups of 32, 64 or 128. `fused_linear` folds a decode step's row-wise work
(norms, rotary, SwiGLU, residual adds) into that matmul and `decode_attention` runs a one-token
step's grouped-head attention over the KV cache, each as one primitive. `available()` is False
where the extension was not built (no compiler at install time); callers then keep their own path.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import mlx.core  # noqa: F401  (registers mx.array with nanobind before _ext loads)

    from exo_mlx_cpu_kernels import _ext  # pyright: ignore[reportAttributeAccessIssue]
except ImportError as exc:  # not built here: callers fall back
    _ext: Any = None
    UNAVAILABLE_REASON = str(exc)
else:
    UNAVAILABLE_REASON = ""

SUPPORTED_BITS = (4, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)


def available() -> bool:
    """Whether the compiled kernels are importable in this environment."""
    return _ext is not None


def supports(bits: int, group_size: int, mode: str = "affine") -> bool:
    """Whether a quantized layer of this kind can use the kernels."""
    return (
        available()
        and mode == "affine"
        and bits in SUPPORTED_BITS
        and group_size in SUPPORTED_GROUP_SIZES
    )


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    if _ext is not None:
        _ext.set_num_threads(max(1, n))
        _ext.set_prefill_attention_threads(max(1, n))


def num_threads() -> int:
    return int(_ext.num_threads()) if _ext is not None else 0


def simd() -> str:
    """'avx512+avx2+fma', 'avx2+fma' or 'portable': the widest path the kernels take on this
    CPU (AVX-512 serves 4-bit layers with float activations and a width divisible by 64; every
    other layer takes AVX2)."""
    return str(_ext.simd()) if _ext is not None else "unavailable"


def force_portable(on: bool) -> None:
    """Take the portable path even where AVX2 is present (tests check both paths)."""
    if _ext is not None:
        _ext.force_portable(on)


def force_avx2(on: bool) -> None:
    """Take the AVX2 paths even where AVX-512 is present (tests check both paths)."""
    if _ext is not None:
        _ext.force_avx2(on)


def vnni() -> bool:
    """Whether int8 activations of 4-bit layers take the AVX-512 VNNI kernel (`vpdpbusd`) on
    this CPU: the CPU has it, the extension was built, and no test forced a narrower path."""
    return bool(_ext.vnni()) if _ext is not None else False


def force_no_vnni(on: bool) -> None:
    """Take the AVX2 int8 kernels even where AVX-512 VNNI is present (tests compare them)."""
    if _ext is not None:
        _ext.force_no_vnni(on)


def _built() -> Any:
    """The extension module, or a RuntimeError saying why it is not built."""
    if _ext is None:
        raise RuntimeError(f"exo_mlx_cpu_kernels is not built: {UNAVAILABLE_REASON}")
    return _ext


def quantized_matmul(
    x: Any,
    w: Any,
    scales: Any,
    biases: Any,
    group_size: int,
    bits: int,
    int8_activations: bool = False,
) -> Any:
    """x @ dequantize(w, scales, biases).T in float32 (x: [..., K], w: [N, K*bits/32] uint32).

    int8_activations: quantize x to int8 per block of 32 values (scale max|x|/127, round to
    nearest even) and take integer dot products, llama.cpp's way; the bias term keeps the exact
    float sums of x. Several times faster; the result is that of `x8 @ W.T + bias sums`, where
    x8 is the int8-rounded x (error ~|W| * max|x_block| / 254 per value).

    biases None: Q4_0's layout, where every bias is -8 x its scale (4 bits, float16 or bfloat16
    scales): the same bits as passing biases = -8 * scales, for 4.5 bits read a weight instead of
    5 (group 32)."""
    return _built().quantized_matmul(x, w, scales, biases, group_size, bits, int8_activations)


def swiglu(gate: Any, up: Any) -> Any:
    """silu(gate) * up for float32 arrays of one shape, as one vectorised primitive (MLX's CPU
    sigmoid runs a scalar exp: ~20 % of a SmolLM2 prefill). Equal to mlx.nn.silu(gate) * up up
    to the float32 rounding of exp."""
    return _built().swiglu(gate, up)


def fused_linear(
    x: Any,
    w: Any,
    scales: Any,
    biases: Any,
    group_size: int,
    bits: int,
    int8_activations: bool,
    ends: list[int],
    *,
    prologue: str = "none",
    norm_weight: Any = None,
    eps: float = 0.0,
    residual: Any = None,
    rope: tuple[int, int, bool, float, float] | None = None,
    rope_offset: Any = None,
    heads_out: bool = False,
) -> list[Any]:
    """[residual +] prologue(x) @ dequantize(w, scales, biases).T in float32, as one MLX
    primitive, split along the output columns at `ends` (the last is w's row count).

    prologue: "none"; "rms_norm" (x * rsqrt(mean(x^2) + eps) * norm_weight, MLX's formula);
    "swiglu" (x is [gate, up]: silu(gate) * up). The matmul is `quantized_matmul`'s, exactly;
    the prologue matches MLX's ops up to float32 rounding (the sum's order, exp's last bit).
    `residual` (one part only) is added to the product. `rope` = (dims, head_dim, traditional,
    base, scale): mx.fast.rope of the first two parts (q, k) by head at position `rope_offset`
    (an int array: one offset, or one per row), up to float32 rounding of sin/cos.
    `heads_out` (x of shape (B, 1, K), `rope`'s head_dim): each part comes shaped
    (B, heads, 1, head_dim), as attention wants it (the same memory, no transpose op).
    biases None: Q4_0's layout, as in `quantized_matmul`."""
    dims, head_dim, traditional, base, scale = rope or (0, 0, False, 10000.0, 1.0)
    return list(
        _built().fused_linear(
            x,
            w,
            scales,
            biases,
            group_size,
            bits,
            int8_activations,
            ends,
            prologue,
            norm_weight,
            eps,
            residual,
            dims,
            head_dim,
            traditional,
            base,
            scale,
            rope_offset,
            heads_out,
        )
    )


def decode_attention(q: Any, k: Any, v: Any, scale: float, mask: Any = None) -> Any:
    """softmax((q * scale) k^T, masked) v for one new token, float32, as one MLX primitive:
    q (B, heads, 1, D), k and v (B, kv heads, N, D) (any strides: the cache's slice views are
    read in place), heads a multiple of kv heads (grouped query heads), mask None, boolean
    (False: the key is left out) or additive, broadcastable to (B, 1, 1, N). Equal to MLX's ops
    up to float32 rounding; a row's output does not depend on its batch or on masked keys."""
    return _built().decode_attention(q, k, v, scale, mask)


def prefill_attention(
    q: Any, k: Any, v: Any, scale: float, mask: Any = None, *, causal: bool = False
) -> Any:
    """softmax((q * scale) k^T, masked) v for many query rows (a prompt), float32, as one tiled
    MLX primitive that never holds the L x N scores: q (B, heads, L, D), k and v (B, kv heads,
    N, D) (any strides), heads a multiple of kv heads. `causal`: row i sees keys up to
    N - L + i (MLX's "causal"); else `mask` None, boolean (False: hidden) or additive,
    broadcastable to (B, 1, L, N). Equal to MLX's attention up to float32 rounding."""
    return _built().prefill_attention(q, k, v, scale, "causal" if causal else None, mask)


def dequantize(w: Any, scales: Any, biases: Any, group_size: int, bits: int) -> Any:
    """dequantize(w, scales, biases) as float32 [N, K] (mx.dequantize, vectorised and threaded)."""
    return _built().dequantize(w, scales, biases, group_size, bits)


if _ext is not None:
    set_num_threads(usable_cores())
