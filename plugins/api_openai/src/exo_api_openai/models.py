"""Model cards as OpenAI model objects (`GET /v1/models`)."""

from __future__ import annotations

from typing import Any

from exo_core.plugin import ModelCard


def model_object(card: ModelCard, created: int) -> dict[str, Any]:
    return {"id": card.model_id, "object": "model", "created": created, "owned_by": "exo"}


def model_list(cards: list[ModelCard], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(c, created) for c in cards]}
