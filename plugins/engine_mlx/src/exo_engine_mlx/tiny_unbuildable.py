"""Families of the README table that have no tiny model here, and why.

`tests/test_every_family.py` runs every architecture mlx-lm serves on a tiny random-weight
model built from `tiny_configs/<model_type>.json`. A family in `UNBUILDABLE` is reported by
that test with the reason instead of being built; a family with neither a tiny config nor an
entry fails the test. Keep the reasons precise (what is missing, where).
"""

from __future__ import annotations

# model_type -> why no tiny model of it runs here. Sorted by name.
UNBUILDABLE: dict[str, str] = {
    "prism_hadamard_qwen35": (
        "its ModelArgs accept only a Hadamard-rotated 2-bit pack (a schema/namespace pair, "
        "quantization exactly affine 2-bit group 128, a packed-module manifest); "
        "make_tiny_model writes float weights, and 2-bit groups of 128 need dimensions "
        "far above a tiny model's"
    ),
}
