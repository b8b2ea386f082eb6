"""Representative families: one runner and a 2-rank group of runners give the same greedy tokens.

Each family is a tiny random-weight model built from mlx-lm's own model class (its real
`model_type`, read back by the real loader), run by real runner subprocesses on a real ring.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.plugin import FinishChunk
from exo_engine_mlx.distributed.testing import final, group_specs, running_group, task, text_of
from exo_engine_mlx.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow

# (model_type, sharding): one representative per code path through real runner subprocesses
# (the runner's group loop, batching two prompts): the engine's PipelineStage (qwen3), mlx-lm's
# pipeline() (qwen3_moe), SlicedStage (gpt_oss), a recurrent state with caches only in some
# layers (nemotron_h), tensor (qwen3_moe). Every other family and split is checked by
# test_every_family_groups (one 2-rank ring, in-process engine, one prompt per family).
CASES = [
    ("qwen3", "pipeline"),
    ("qwen3_moe", "pipeline"),
    ("gpt_oss", "pipeline"),
    ("nemotron_h", "pipeline"),
    ("qwen3_moe", "tensor"),
]
# Two prompts of different lengths: a family with a recurrent state (nemotron_h) must give
# each the answer it gives alone (its prompts are prefilled one at a time, see batching.py).
PROMPTS = {"a": "hello world", "b": "the quick brown fox jumps over the lazy dog"}


def _greedy(model_dir: Path, sharding: str, world: int) -> dict[str, str]:
    # Uneven layers (1 and 3 of 4), so a rank's share is not just half.
    weights = [1, 3] if world == 2 and sharding == "pipeline" else None
    specs = group_specs(model_dir, sharding=sharding, world=world, layer_weights=weights)  # type: ignore[arg-type]
    with running_group(specs) as group:
        results = group.generate_many([task(k, v, max_tokens=12) for k, v in PROMPTS.items()])
    out = {}
    for task_id, by_rank in results.items():
        assert isinstance(final(by_rank[0]), FinishChunk), by_rank[0]
        out[task_id] = text_of(by_rank[0])
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {
        t: make_tiny_model(root / t, model_type=t, layers=4) for t in sorted({t for t, _ in CASES})
    }


@pytest.fixture(scope="module")
def single(models: dict[str, Path]) -> dict[str, dict[str, str]]:
    return {t: _greedy(path, "pipeline", 1) for t, path in models.items()}


@pytest.mark.parametrize(("model_type", "sharding"), CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_two_ranks_equal_one(
    models: dict[str, Path], single: dict[str, dict[str, str]], model_type: str, sharding: str
) -> None:
    assert all(single[model_type].values())
    assert _greedy(models[model_type], sharding, 2) == single[model_type]
