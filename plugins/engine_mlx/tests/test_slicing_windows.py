"""`slicing_windows` on one rank: AFM 7's split points (its KV-reuse layers read the last
regular layer's cache, so a pipeline's last split point moves back to that layer) and Cohere
2's own forward and head on a stage (greedy tokens would not show its logit scale). The
2-rank runs of every family in `slicing_windows` are in test_every_family_groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from exo_engine_mlx.distributed.pipeline import PipelineUnsupported, SlicedStage, split_pipeline
from exo_engine_mlx.distributed.slicing_windows import kv_reuse_counts
from exo_engine_mlx.tiny_model import make_tiny_model

PROMPT = [[5, 17, 42, 8, 99, 3, 250, 7, 61, 12, 33]]  # longer than the tiny window of 8


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


def test_a_split_that_parts_the_reuse_layers_from_their_source_is_refused(tmp_path: Path) -> None:
    # Tiny AFM 7: layers 0-1 regular, 2-3 read layer 1's cache. Counts that do not match the
    # group (one rank here) are not moved, so [0, 2) stands and is refused.
    model: Any = load(str(make_tiny_model(tmp_path / "a", model_type="afm7", layers=4)))[0]
    with pytest.raises(PipelineUnsupported, match="part its KV-reuse layers"):
        split_pipeline(model, 0, 2, (2, 2), mx.distributed.init())


def _logits(model: Any, cache: list[Any]) -> list[mx.array]:
    first = model(mx.array(PROMPT), cache=cache)[:, -1, :]
    second = model(mx.array([[9]]), cache=cache)[:, -1, :]
    mx.eval(first, second)
    return [first.astype(mx.float32), second.astype(mx.float32)]


def test_a_cohere2_stage_with_every_layer_computes_its_logits(tmp_path: Path) -> None:
    path = str(make_tiny_model(tmp_path / "c", model_type="cohere2", layers=4))
    whole: Any = load(path)[0]
    expected = _logits(whole, make_prompt_cache(whole))
    stage = split_pipeline(load(path)[0], 0, 4, (4,), mx.distributed.init())
    assert isinstance(stage, SlicedStage)
    for want, got in zip(expected, _logits(stage, stage.make_cache()), strict=True):
        assert mx.allclose(want, got, atol=1e-4).item()
