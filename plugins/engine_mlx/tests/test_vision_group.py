"""A 2-rank pipeline of the tiny vision model (real runner subprocesses on a real ring): the
first rank runs the vision tower, the second only lays out the same token ids, and the answer
about an image is one runner's."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from exo_core.plugin import Capability, FinishChunk, Task
from exo_core.plugin.engine import RunnerSpec
from exo_engine_mlx.distributed.testing import final, group_specs, running_group, task, text_of

from .test_vision import BLUE, RED, ask

pytestmark = pytest.mark.slow


def _vision_specs(model_dir: Path, world: int) -> list[RunnerSpec]:
    specs = group_specs(model_dir, sharding="pipeline", world=world)
    caps = (Capability.TEXT, Capability.VISION)
    return [replace(s, card=replace(s.card, capabilities=caps)) for s in specs]


def _answers(model_dir: Path, world: int) -> dict[str, str]:
    tasks: list[Task] = [
        replace(task(name, max_tokens=10), params=ask(image))
        for name, image in (("red", RED), ("blue", BLUE))
    ]
    with running_group(_vision_specs(model_dir, world)) as group:
        results = group.generate_many(tasks)
    out = {}
    for task_id, by_rank in results.items():
        assert isinstance(final(by_rank[0]), FinishChunk), by_rank[0]
        out[task_id] = text_of(by_rank[0])
    return out


def test_two_pipeline_ranks_answer_as_one(tmp_path: Path) -> None:
    from exo_engine_mlx.tiny_vision import write_tiny_vision

    model = write_tiny_vision(tmp_path / "tiny-vision", "tiny-vision")
    alone = _answers(model, 1)
    assert alone["red"] != alone["blue"]
    assert _answers(model, 2) == alone
