"""`exo import-gguf` through the `exo` command: the model is then offered under its id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exo_core.plugin import NodeConfig
from exo_engine_mlx.plugin import exo_model_cards

from .conftest import TinySpec, write_tiny_gguf


def test_import_then_the_card_is_offered(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec())
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "exo_core.cli", "--data-dir", str(data),
         "import-gguf", str(gguf), "--model-id", "my-tiny"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "my-tiny" in done.stdout
    cards = {c.model_id: c for c in exo_model_cards(NodeConfig(data_dir=str(data)))}
    card = cards["my-tiny"]
    assert card.source.startswith("local:") and Path(card.source[6:]).is_dir()
    assert card.n_layers == TinySpec().layers and card.hidden_size == TinySpec().hidden


def test_import_refuses_what_it_cannot_convert(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "qwen.gguf", TinySpec(arch="qwen2"))
    done = subprocess.run(
        [sys.executable, "-m", "exo_core.cli", "--data-dir", str(tmp_path / "d"),
         "import-gguf", str(gguf), "--model-id", "x"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "qwen2" in done.stderr
