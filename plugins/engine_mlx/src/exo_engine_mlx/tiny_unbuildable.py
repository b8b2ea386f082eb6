"""Families of the README table that have no tiny model, and why.

`tests/test_every_family.py` runs every architecture mlx-lm serves on a tiny random-weight
model built from `tiny_configs/<model_type>.json`. A family listed here is reported by that
test with the reason below instead of being built; a family with neither a tiny config nor an
entry here fails the test. Keep the reasons precise (what is missing, where), so the entry is
removed once the cause is gone.
"""

from __future__ import annotations

# model_type -> why no tiny model of it runs here. Sorted by name.
UNBUILDABLE: dict[str, str] = {}
