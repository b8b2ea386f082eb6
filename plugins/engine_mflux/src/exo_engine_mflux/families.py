"""The image families the runner knows, and which one a card names (no mflux import)."""

from __future__ import annotations

from exo_core.plugin import ModelCard

# Families the runner knows (see `pipeline.FAMILIES`; kept here so the node never imports mflux).
FAMILIES = frozenset(
    {
        "flux1-schnell",
        "flux1-dev",
        "flux1-krea-dev",
        "flux1-kontext-dev",
        "qwen-image",
        "qwen-image-edit",
    }
)


def pipeline_family(card: ModelCard) -> str:
    """The pipeline that runs `card`: its `model_type` (exo's cards name the family "flux" for
    every FLUX.1 variant; the catalogue's additions name the variant), else its family."""
    return card.model_type or card.family
