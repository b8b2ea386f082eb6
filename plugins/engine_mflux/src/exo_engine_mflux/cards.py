"""Image model cards found beside local models (`<models dir>/<name>/exo-image-card.json`)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from loguru import logger

from exo_core.plugin import ModelCard, ModelComponent, ModelId, ModelTask

# Not engine_mlx's `exo-card.json`: without this plugin, an image card must not appear at all.
CARD_FILE = "exo-image-card.json"
# mflux's component directories, by the card's component names.
COMPONENT_DIRS = {
    "transformer": "transformer",
    "vae": "vae",
    "clip_encoder": "text_encoder",
    "t5_encoder": "text_encoder_2",
}


def local_image_cards(models_dir: Path) -> list[ModelCard]:
    cards: list[ModelCard] = []
    for path in sorted(models_dir.glob(f"*/{CARD_FILE}")):
        try:
            card = msgspec.json.decode(path.read_bytes(), type=ModelCard)
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as e:
            logger.warning(f"ignoring the unreadable model card {path}: {e}")
            continue
        if card.makes_images:
            cards.append(card)
    return cards


def local_flux_card(
    model_dir: Path,
    model_id: str,
    sizes: dict[str, int],
    *,
    blocks: int,
    family: str = "flux1-schnell",
    edits: bool = True,
    quantization: str = "bf16",
) -> ModelCard:
    """A card for a FLUX.1 model in mflux's saved layout at `model_dir` (bf16 weights).

    A text-to-image FLUX.1 model also edits (image to image from the upload)."""
    tasks = (ModelTask.IMAGE_GENERATION, *((ModelTask.IMAGE_EDIT,) if edits else ()))
    return local_image_card(
        model_dir,
        model_id,
        sizes,
        blocks=blocks,
        family=family,
        tasks=tasks,
        hidden_size=3072,
        quantization=quantization,
    )


def local_image_card(
    model_dir: Path,
    model_id: str,
    sizes: dict[str, int],
    *,
    blocks: int,
    family: str,
    tasks: tuple[ModelTask, ...],
    hidden_size: int,
    quantization: str = "bf16",
    uses_cfg: bool = False,
) -> ModelCard:
    """A card for an image model at `model_dir`: its components (the transformer's `blocks`
    are the part a split divides), the image tasks it serves, and whether it runs
    classifier-free guidance (two transformer passes a step, as exo's cards say)."""
    return ModelCard(
        model_id=ModelId(model_id),
        family=family,
        n_layers=blocks,
        hidden_size=hidden_size,
        storage_size_bytes=sum(sizes.values()),
        quantization=quantization,
        tasks=tasks,
        capabilities=(),
        source=f"local:{model_dir}",
        uses_cfg=uses_cfg,
        components=tuple(
            ModelComponent(
                name=name,
                storage_size_bytes=size,
                splittable=name == "transformer",
                n_blocks=blocks if name == "transformer" else 0,
            )
            for name, size in sizes.items()
        ),
    )


def write_card(model_dir: Path, card: ModelCard) -> None:
    (model_dir / CARD_FILE).write_bytes(msgspec.json.encode(card))
