"""AFM 7's split points: its KV-reuse layers read the last regular layer's cache, so the
engine moves a pipeline's last split point back to that layer (the 2-rank runs of every
family in `slicing_windows` are in test_every_family_groups)."""

from __future__ import annotations

import pytest

from exo_engine_mlx.distributed.slicing_windows import kv_reuse_counts


@pytest.mark.parametrize(
    ("counts", "n_regular", "moved"),
    [
        ((1, 3), 2, (1, 3)),  # the last rank starts at the source layer: kept
        ((2, 2), 2, (1, 3)),  # it would hold only reuse layers: one layer moves over
        ((28, 28), 35, (28, 28)),  # starts before the source: kept
        ((19, 19, 18), 35, (19, 15, 22)),  # taken from the nearest rank first
        ((2, 1, 1), 3, (1, 1, 2)),  # ...and then from the ones before it, one layer kept each
        ((4,), 2, (4,)),  # one rank holds everything
    ],
)
def test_the_last_rank_holds_the_source_and_every_reuse_layer(
    counts: tuple[int, ...], n_regular: int, moved: tuple[int, ...]
) -> None:
    got = kv_reuse_counts(counts, n_regular)
    assert got == moved
    assert sum(got) == sum(counts) and min(got) >= 1
    assert sum(got[:-1]) <= n_regular - 1  # the last rank starts at or before the source


def test_fewer_regular_layers_than_ranks_cannot_split() -> None:
    with pytest.raises(ValueError, match="3 ranks need at least 3 regular layers, it has 2"):
        kv_reuse_counts((1, 1, 2), 2)
