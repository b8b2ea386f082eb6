"""Cards in exo's own format load as this project's cards (the same model either way)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.model_cards import (
    Capability,
    ModelCardError,
    ModelComponent,
    ModelTask,
    load_card_file,
)

TEXT_CARD = """
model_id = "example-org/Big-MoE-4bit"
n_layers = 48
hidden_size = 2048
num_key_value_heads = 4
supports_tensor = true
tasks = ["TextGeneration"]
family = "qwen"
quantization = "4bit"
base_model = "Big MoE"
capabilities = ["text", "thinking", "thinking_toggle", "code"]
reasoning_dialect = "suffix"
context_length = 32768
backends = ["MlxMetal", "MlxCpu"]

[storage_size]
in_bytes = 17000000000

[sampling_defaults]
temperature = 0.6
"""

IMAGE_EDIT_CARD = """
model_id = "example-org/Image-Edit"
n_layers = 20
hidden_size = 1
supports_tensor = false
tasks = ["ImageToImage"]
family = "flux"
quantization = ""
base_model = "Image Edit"
capabilities = ["image_gen", "image_edit"]
backends = ["MlxMetal"]

[storage_size]
in_bytes = 1000

[[components]]
component_name = "transformer"
component_path = "transformer/"
n_layers = 20
can_shard = true

[components.storage_size]
in_bytes = 900
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "card.toml"
    path.write_text(text)
    return path


def test_an_exo_text_card_reads_as_ours(tmp_path: Path) -> None:
    card = load_card_file(write(tmp_path, TEXT_CARD))
    assert card.model_id == "example-org/Big-MoE-4bit"
    assert card.source == "hf:example-org/Big-MoE-4bit"
    assert card.storage_size_bytes == 17_000_000_000
    assert (card.n_layers, card.hidden_size, card.num_key_value_heads) == (48, 2048, 4)
    assert card.supports_tensor and card.quantization == "4bit" and card.family == "qwen"
    assert card.tasks == (ModelTask.TEXT_GENERATION,)
    assert card.capabilities == (
        Capability.TEXT,
        Capability.THINKING,
        Capability.THINKING_TOGGLE,
        Capability.CODE,
    )
    assert card.reasoning_dialect == "suffix" and card.context_length == 32768
    assert card.vision is None and not card.uses_cfg


def test_an_exo_vision_table_and_cfg_flag_are_kept(tmp_path: Path) -> None:
    vision = '\n[vision]\nimage_token_id = 7\nmodel_type = "kimi_vl"\n'
    card = load_card_file(
        write(tmp_path, TEXT_CARD.replace("\n[storage_size]", vision + "\n[storage_size]"))
    )
    assert card.vision is not None
    assert (card.vision.image_token_id, card.vision.model_type) == (7, "kimi_vl")
    assert card.vision.weights_repo == card.model_id  # exo's default: the model's own repo
    cfg = load_card_file(
        write(tmp_path, IMAGE_EDIT_CARD.replace("hidden_size", "uses_cfg = true\nhidden_size"))
    )
    assert cfg.uses_cfg and cfg.has(Capability.IMAGE_GEN)


def test_an_exo_image_edit_card_is_an_image_model_that_edits(tmp_path: Path) -> None:
    card = load_card_file(write(tmp_path, IMAGE_EDIT_CARD))
    assert card.tasks == (ModelTask.IMAGE_EDIT,) and card.makes_images
    assert card.components == (
        ModelComponent(name="transformer", storage_size_bytes=900, splittable=True, n_blocks=20),
    )
    assert card.has(Capability.IMAGE_EDIT) and not card.has(Capability.TEXT)
    assert card.quantization == "none"


def test_an_unknown_exo_task_is_refused_with_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, TEXT_CARD.replace('"TextGeneration"', '"Telepathy"'))
    with pytest.raises(ModelCardError, match=r"card\.toml.*Telepathy"):
        load_card_file(path)


def test_our_own_format_is_unchanged(tmp_path: Path) -> None:
    ours = 'model_id = "a/b"\nfamily = "llama"\nn_layers = 2\nhidden_size = 8\n'
    card = load_card_file(write(tmp_path, ours + "storage_size_bytes = 10\n"))
    assert card.storage_size_bytes == 10 and card.source == ""
    with pytest.raises(ModelCardError, match="storage_size"):
        load_card_file(write(tmp_path, ours))
