"""The vectorised SwiGLU against mlx.nn.silu(gate) * up."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import exo_mlx_cpu_kernels as kernels

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernels not built: {kernels.UNAVAILABLE_REASON}"
)


@pytest.mark.parametrize("shape", [(13,), (4, 1536), (2, 3, 77)])
def test_matches_mlx_silu_times_up(shape: tuple[int, ...]) -> None:
    gate = mx.random.normal(shape, key=mx.random.key(1)) * 6
    up = mx.random.normal(shape, key=mx.random.key(2))
    got = kernels.swiglu(gate, up)
    assert got.shape == gate.shape and got.dtype == mx.float32
    expected = nn.silu(gate) * up
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=2e-6, atol=1e-7)


def test_extremes_saturate_and_nan_stays_nan() -> None:
    gate = mx.array([-1e4, -100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0, 1e4, float("nan")])
    got = np.array(kernels.swiglu(gate, mx.ones_like(gate)))
    assert np.all(np.abs(got[:3]) < 1e-30)  # silu(g) -> 0 from below, no inf * 0 = NaN
    np.testing.assert_allclose(got[3:9], np.array(nn.silu(gate[3:9])), rtol=2e-6, atol=1e-7)
    assert np.isnan(got[9])


def test_a_value_does_not_depend_on_its_place_or_path() -> None:
    """The 8-lane loop, its scalar tail and the portable path give the same bits."""
    gate = mx.random.normal((37,), key=mx.random.key(3)) * 4
    up = mx.random.normal((37,), key=mx.random.key(4))
    whole = np.array(kernels.swiglu(gate, up))
    for i in (0, 7, 8, 31, 32, 36):
        np.testing.assert_array_equal(
            np.array(kernels.swiglu(gate[i : i + 1], up[i : i + 1])), whole[i : i + 1]
        )
    kernels.force_portable(True)
    try:
        np.testing.assert_array_equal(np.array(kernels.swiglu(gate, up)), whole)
    finally:
        kernels.force_portable(False)


def test_strided_inputs_and_bad_arguments() -> None:
    gate = mx.random.normal((8, 6), key=mx.random.key(5)).T  # not row-contiguous
    up = mx.random.normal((6, 8), key=mx.random.key(6))
    np.testing.assert_allclose(
        np.array(kernels.swiglu(gate, up)), np.array(nn.silu(gate) * up), rtol=2e-6, atol=1e-7
    )
    with pytest.raises(ValueError, match="one shape"):
        kernels.swiglu(gate, up[:3])
    with pytest.raises(ValueError, match="float32"):
        kernels.swiglu(gate.astype(mx.float16), up.astype(mx.float16))
