"""Families of the README table that have no tiny model here, and why.

`tests/test_every_family.py` runs every architecture mlx-lm serves on a tiny random-weight
model built from `tiny_configs/<model_type>.json`. A family in `UNBUILDABLE` is reported by
that test with the reason instead of being built; a family with neither a tiny config nor an
entry fails the test. Keep the reasons precise (what is missing, where).
"""

from __future__ import annotations

# model_type -> why no tiny model of it runs here. Sorted by name.
UNBUILDABLE: dict[str, str] = {}
