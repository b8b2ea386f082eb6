"""Fixtures of the image engine tests: one tiny random-weight FLUX.1 model per session, and
a real node (every installed plugin, real image runner subprocess) serving it over HTTP."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from PIL import Image

from exo_core.testing.harness import running_node

MODEL_ID = "tiny-flux"
SIZE = "64x64"


@pytest.fixture(scope="session")
def tiny_flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory: mflux's saved layout, 1 single block, ~1.2 GB of fp32 weights."""
    from exo_engine_mflux.tiny_model import write_tiny_model_with_card

    return write_tiny_model_with_card(tmp_path_factory.mktemp("image-models") / MODEL_ID, MODEL_ID)


def link_model(data_dir: Path, model: Path) -> None:
    """Put the model into a node's models directory (a link: it is large)."""
    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / model.name).symlink_to(model, target_is_directory=True)


@dataclass
class ImageNode:
    url: str
    data_dir: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def image_node(tmp_path_factory: pytest.TempPathFactory, tiny_flux: Path) -> Iterator[ImageNode]:
    data = tmp_path_factory.mktemp("image-node")
    link_model(data, tiny_flux)
    with running_node(data, entry_points=True, keepalive_s=1.0) as node:
        yield ImageNode(url=node.url, data_dir=data)


def png_bytes(
    size: tuple[int, int] = (64, 64), color: tuple[int, int, int] = (200, 30, 30)
) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()
