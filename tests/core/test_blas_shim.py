"""The prefix shim the core builds so that a BLAS with prefixed symbols (scipy-openblas) can be
preloaded under the plain cblas names."""

from __future__ import annotations

from exo_core.blas import build_prefix_shim


def test_shim_is_a_small_elf() -> None:
    blob = build_prefix_shim("/nonexistent/libx.so", "scipy_")
    assert blob[:4] == b"\x7fELF" and len(blob) < 80_000
    assert b"scipy_cblas_sgemm\0" in blob and b"/nonexistent/libx.so\0" in blob
