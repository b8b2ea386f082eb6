"""The core's engine conformance suite on the MLX engine, with a tiny random model."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.plugin import ModelCard, ModelId
from exo_core.testing.engine_conformance import *  # noqa: F403
from exo_core.testing.engine_conformance import EngineCase
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def engine_case(model_dir: Path) -> EngineCase:
    card = ModelCard(
        model_id=ModelId("tiny"), family="llama", n_layers=2, hidden_size=64,
        storage_size_bytes=1, source=f"local:{model_dir}",
    )  # fmt: skip
    return EngineCase(engine=MlxEngine(), card=card, model_path=model_dir)
