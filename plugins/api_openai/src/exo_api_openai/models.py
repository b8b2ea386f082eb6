"""Model cards as OpenAI model objects (`GET /v1/models`)."""

from __future__ import annotations

from typing import Any

from exo_core.model_cards import ModelCard


def model_object(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's model object, plus exo's `tasks` (text_generation, image_generation,
    image_edit) so clients can tell image models from text models."""
    return {
        "id": card.model_id,
        "object": "model",
        "created": created,
        "owned_by": "exo",
        "tasks": [t.value for t in card.tasks],
    }


def model_list(cards: list[ModelCard], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(c, created) for c in cards]}
