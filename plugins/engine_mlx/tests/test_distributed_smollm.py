"""Runner groups on the embedded SmolLM2-135M (30 layers, 9 heads, 3 KV heads): three ranks,
pipeline and tensor, give the single process's greedy text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_core.plugin import FinishChunk
from exo_engine_mlx.distributed.testing import final, group_specs, running_group, task, text_of
from exo_engine_mlx.embedded import ensure_embedded_model
from exo_engine_mlx.testing import float_activations

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

PROMPTS = {
    "capital": "What is the capital of France?",
    "poem": "Write one line about the sea.",
}


@pytest.fixture(scope="module", autouse=True)
def _float() -> Iterator[None]:
    # A tensor split's text equals one node's token for token with float activations only.
    with float_activations():
        yield


@pytest.fixture(scope="module")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_embedded_model(tmp_path_factory.mktemp("models"))


def _texts(model_dir: Path, sharding: str, world: int, weights: list[int] | None = None) -> dict:
    specs = group_specs(model_dir, sharding=sharding, world=world, layer_weights=weights)  # type: ignore[arg-type]
    with running_group(specs) as group:
        tasks = [task(k, v, max_tokens=24) for k, v in PROMPTS.items()]
        results = group.generate_many(tasks)
    out = {}
    for task_id, by_rank in results.items():
        assert isinstance(final(by_rank[0]), FinishChunk)
        out[task_id] = text_of(by_rank[0])
    return out


@pytest.fixture(scope="module")
def single(smollm: Path) -> dict:
    return _texts(smollm, "pipeline", 1)


def test_three_rank_pipeline_equals_single_node(smollm: Path, single: dict) -> None:
    # Uneven layers (as placement gives nodes with different free memory).
    assert _texts(smollm, "pipeline", 3, weights=[3, 2, 1]) == single


def test_three_rank_tensor_equals_single_node(smollm: Path, single: dict) -> None:
    assert _texts(smollm, "tensor", 3) == single
