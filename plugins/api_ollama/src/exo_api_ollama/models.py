"""Ollama's view of a model card: the entries of `/api/tags` and `/api/ps`, and `/api/show`."""

from __future__ import annotations

import hashlib
from typing import Any

from exo_core.plugin import Capability, ModelCard


def details(card: ModelCard) -> dict[str, Any]:
    return {
        "parent_model": card.base_model,
        "format": "",
        "family": card.family,
        "families": [card.family],
        "parameter_size": "",
        "quantization_level": card.quantization,
    }


def digest(card: ModelCard) -> str:
    # Ollama's digest is of the model file; a stable hash of the id serves clients that key on it.
    return hashlib.sha256(card.model_id.encode()).hexdigest()


def model_entry(card: ModelCard, modified_at: str) -> dict[str, Any]:
    return {
        "name": card.model_id,
        "model": card.model_id,
        "modified_at": modified_at,
        "size": card.storage_size_bytes,
        "digest": digest(card),
        "details": details(card),
        "capabilities": capabilities(card),
    }


# Instances stay until deleted, so they never expire as Ollama's keep_alive would.
NEVER = "9999-12-31T23:59:59Z"


def running_entry(card: ModelCard) -> dict[str, Any]:
    return {
        "name": card.model_id,
        "model": card.model_id,
        "size": card.storage_size_bytes,
        "digest": digest(card),
        "details": details(card),
        "expires_at": NEVER,
        "size_vram": card.storage_size_bytes,
    }


def capabilities(card: ModelCard) -> list[str]:
    names = {
        Capability.TEXT: "completion",
        Capability.TOOLS: "tools",
        Capability.THINKING: "thinking",
        Capability.VISION: "vision",
    }
    found = [names[c] for c in card.capabilities if c in names]
    # Image models (text to image, image edits) say so, as Ollama's image models do.
    return [*found, "image"] if card.makes_images else found


# Ollama's names for the card's sampling defaults, in the order `/api/show` lists them.
_PARAMETER_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def parameters(card: ModelCard) -> str:
    """The card's sampling defaults as Ollama's `parameters` text (one padded `name value`
    line each, as a Modelfile's PARAMETER lines show there)."""
    defaults = card.sampling_defaults
    lines = [
        f"{ours_as:<30} {value:g}"
        for ours, ours_as in _PARAMETER_NAMES.items()
        if (value := getattr(defaults, ours)) is not None
    ]
    return "\n".join(lines)


def show(card: ModelCard, modified_at: str) -> dict[str, Any]:
    family = card.family
    return {
        "modelfile": "",
        "parameters": parameters(card),
        "template": "",
        "details": details(card),
        "model_info": {
            "general.architecture": family,
            "general.basename": card.model_id,
            f"{family}.block_count": card.n_layers,
            f"{family}.embedding_length": card.hidden_size,
        },
        "capabilities": capabilities(card),
        "modified_at": modified_at,
    }
