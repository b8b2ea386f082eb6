"""`exo --no-batch`: a runner decodes one request at a time; the next waits for its turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from exo_core.plugin import (
    ChatMessage,
    FinishChunk,
    GenerationParams,
    NodeConfig,
    SamplingParams,
    TaskId,
    TextChunk,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.plugin import exo_engines
from exo_engine_mlx.tiny_model import make_tiny_model


def test_no_batch_gives_runners_one_request_at_a_time() -> None:
    env = {"EXO_MAX_CONCURRENT_REQUESTS": "6"}
    (batching,) = exo_engines(config=NodeConfig())
    (serial,) = exo_engines(config=NodeConfig(batch=False))
    assert isinstance(batching, MlxEngine) and isinstance(serial, MlxEngine)
    assert batching.runner_options(env).max_concurrent == 6
    assert serial.runner_options(env).max_concurrent == 1


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model_dir: Path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return mlx_lm.load(str(model_dir))[:2]  # type: ignore[return-value]


def _order(engine: BatchEngine) -> list[str]:
    """Which request each text chunk belongs to, in the order the steps produce them."""
    for name in ("first", "second"):
        request = GenerationParams(
            messages=(ChatMessage(role="user", content=f"{name} request"),),
            sampling=SamplingParams(temperature=0),
            max_tokens=6,
        )
        assert engine.submit(TaskId(name), request) == []
    order: list[str] = []
    while engine.active:
        for chunk in engine.step():
            if isinstance(chunk, TextChunk | FinishChunk):
                order.append(f"{chunk.task_id}:{type(chunk).__name__}")
    return order


def test_one_at_a_time_finishes_the_first_before_the_second_starts(
    loaded: tuple[Any, Any],
) -> None:
    serial = _order(BatchEngine(*loaded, max_concurrent=1))
    first_done = serial.index("first:FinishChunk")
    assert all(entry.startswith("first:") for entry in serial[: first_done + 1])
    assert serial[-1] == "second:FinishChunk"
    # With batching the two requests' tokens interleave.
    batched = _order(BatchEngine(*loaded, max_concurrent=2))
    assert batched.index("second:TextChunk") < batched.index("first:FinishChunk")
