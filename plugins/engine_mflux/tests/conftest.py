"""Fixtures of the image engine tests: one tiny random-weight FLUX.1 model per session, and
a real `exo` process (every installed plugin, a real image runner subprocess) serving it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from exo_core.testing.processes import exo_processes, wait_until

MODEL_ID = "tiny-flux"
SIZE = "64x64"


@pytest.fixture(scope="session")
def tiny_flux(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory: mflux's saved layout, 1 single block, a narrow VAE, ~390 MB of
    bf16 weights."""
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
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def image_node(tmp_path_factory: pytest.TempPathFactory, tiny_flux: Path) -> Iterator[ImageNode]:
    root = tmp_path_factory.mktemp("image-node")
    link_model(root / "node0", tiny_flux)
    # No warm-up generation: the tests' first request is the warm-up.
    env = {"EXO_RUNNER_WARMUP": "0"}
    with exo_processes(root, 1, extra_args=[["--transport", "memory"]], env=env) as (node,):
        wait_until(lambda: MODEL_ID in models(node.url), timeout=60)
        yield ImageNode(url=node.url, data_dir=node.data_dir, log_path=node.log_path)


def models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]}


def png_bytes(
    size: tuple[int, int] = (64, 64), color: tuple[int, int, int] = (200, 30, 30)
) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()
