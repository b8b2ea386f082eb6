"""Model cards as OpenAI model objects (`GET /v1/models`)."""

from __future__ import annotations

from typing import Any

from exo_core.plugin import ModelCard


def model_object(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's model object, plus the fields exo's model list adds (Open WebUI reads some):
    size, family, capabilities, reasoning dialect... `tasks` are this project's names
    (text_generation, image_generation, image_edit), so clients can tell image models from
    text models."""
    return {
        "id": card.model_id,
        "object": "model",
        "created": created,
        "owned_by": "exo",
        "hugging_face_id": card.model_id,
        "name": card.model_id.split("/")[-1],
        "description": "",
        "context_length": card.context_length or 0,
        "tags": [],
        "storage_size_megabytes": round(card.storage_size_bytes / 2**20),
        "supports_tensor": card.supports_tensor,
        "tasks": [t.value for t in card.tasks],
        "is_custom": card.custom,
        "family": card.family,
        "quantization": card.quantization,
        "base_model": card.base_model,
        "capabilities": [c.value for c in card.capabilities],
        "reasoning_dialect": card.reasoning_dialect,
    }


def model_list(cards: list[ModelCard], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(c, created) for c in cards]}
