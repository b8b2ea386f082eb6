"""`fused_linear`: a decode step's norm / activation / rotary / residual around the kernel's
matmul, as one primitive, against MLX's own ops.

The matmul is `quantized_matmul`'s, so the parts and the residual add are compared bit for bit;
the prologues and the rotary are MLX's formulas computed in another order (the norm's sum,
exp/sin/cos's last bit): within 1e-5 of the largest output.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import exo_mlx_cpu_kernels as kernels

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernels not built: {kernels.UNAVAILABLE_REASON}"
)


def _layer(n: int, k: int, bits: int = 4, group_size: int = 32) -> tuple[mx.array, ...]:
    w = mx.random.normal((n, k), key=mx.random.key(n + k + bits))
    return mx.quantize(w, group_size=group_size, bits=bits)


def _close(got: mx.array, want: mx.array) -> None:
    scale = float(np.abs(np.array(want)).max())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5 * scale)


def _x(*shape: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(sum(shape)))


@pytest.mark.parametrize("int8", [False, True])
def test_parts_and_residual_are_the_kernels_bits(int8: bool) -> None:
    wq, scales, biases = _layer(320, 256)
    x = _x(1, 1, 256)
    whole = kernels.quantized_matmul(x, wq, scales, biases, 32, 4, int8)
    parts = kernels.fused_linear(x, wq, scales, biases, 32, 4, int8, [128, 192, 320])
    assert [p.shape for p in parts] == [(1, 1, 128), (1, 1, 64), (1, 1, 128)]
    assert np.array_equal(np.array(mx.concatenate(parts, axis=-1)), np.array(whole))
    residual = _x(1, 1, 320)
    (added,) = kernels.fused_linear(x, wq, scales, biases, 32, 4, int8, [320], residual=residual)
    assert np.array_equal(np.array(added), np.array(residual + whole))


@pytest.mark.parametrize("rows", [1, 3])
def test_rms_norm_prologue_matches_mlx(rows: int) -> None:
    wq, scales, biases = _layer(96, 256, bits=8, group_size=64)
    x, weight = _x(rows, 256) * 3.0, _x(256)
    want = kernels.quantized_matmul(mx.fast.rms_norm(x, weight, 1e-5), wq, scales, biases, 64, 8)
    (got,) = kernels.fused_linear(
        x, wq, scales, biases, 64, 8, False, [96], prologue="rms_norm", norm_weight=weight, eps=1e-5
    )
    _close(got, want)


def test_swiglu_prologue_matches_mlx() -> None:
    wq, scales, biases = _layer(64, 256)
    gate_up = _x(1, 512) * 4.0
    gate, up = mx.split(gate_up, 2, axis=-1)
    want = kernels.quantized_matmul(gate * mx.sigmoid(gate) * up, wq, scales, biases, 32, 4)
    (got,) = kernels.fused_linear(
        gate_up, wq, scales, biases, 32, 4, False, [64], prologue="swiglu"
    )
    _close(got, want)


@pytest.mark.parametrize("heads_out", [False, True])
@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("dims", [64, 32])  # 32: only part of each 64-wide head rotates
def test_rope_of_q_and_k_matches_mx_fast_rope(
    traditional: bool, dims: int, heads_out: bool
) -> None:
    heads, kv_heads, head_dim = 4, 2, 64
    n_q, n_kv = heads * head_dim, kv_heads * head_dim
    wq, scales, biases = _layer(n_q + 2 * n_kv, 128)
    x = _x(1, 1, 128)
    offset = mx.array(37)
    q, k, v = kernels.fused_linear(
        x, wq, scales, biases, 32, 4, False, [n_q, n_q + n_kv, n_q + 2 * n_kv]
    )
    rope = (dims, head_dim, traditional, 10000.0, 1.0)
    got = kernels.fused_linear(
        x,
        wq,
        scales,
        biases,
        32,
        4,
        False,
        [n_q, n_q + n_kv, n_q + 2 * n_kv],
        rope=rope,
        rope_offset=offset,
        heads_out=heads_out,
    )

    def by_head(part: mx.array, n_heads: int) -> mx.array:
        return part.reshape(1, 1, n_heads, head_dim).transpose(0, 2, 1, 3)

    def rotated(part: mx.array, n_heads: int) -> mx.array:
        out = mx.fast.rope(
            by_head(part, n_heads),
            dims,
            traditional=traditional,
            base=1e4,
            scale=1.0,
            offset=offset,
        )
        return out if heads_out else out.transpose(0, 2, 1, 3).reshape(1, 1, -1)

    assert got[0].shape == ((1, heads, 1, head_dim) if heads_out else (1, 1, n_q))
    _close(got[0], rotated(q, heads))
    _close(got[1], rotated(k, kv_heads))
    assert np.array_equal(np.array(got[2]), np.array(by_head(v, kv_heads) if heads_out else v))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prologue": "gelu"}, "prologue"),
        ({"prologue": "rms_norm"}, "rms_norm needs a weight"),
        ({"ends": [10, 90]}, "ends"),
        ({"ends": [50, 40, 96]}, "ends"),
        ({"residual": mx.zeros((1, 95))}, "residual"),
        ({"rope": (64, 64, False, 1e4, 1.0)}, "rope"),
        ({"heads_out": True}, "heads_out"),
        (
            {"rope": (64, 32, False, 1e4, 1.0), "ends": [32, 64, 96], "rope_offset": mx.array(1)},
            "rope",
        ),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, object], message: str) -> None:
    wq, scales, biases = _layer(96, 128)
    args: dict[str, object] = {"ends": [96], **kwargs}
    ends = args.pop("ends")
    with pytest.raises(ValueError, match=message):
        kernels.fused_linear(mx.zeros((1, 128)), wq, scales, biases, 32, 4, False, ends, **args)  # type: ignore[arg-type]
