"""Hook implementations of the mflux image engine plugin."""

from __future__ import annotations

from exo_core.plugin import ModelCard, NodeConfig, State, hookimpl
from exo_core.plugin.engine import Engine
from exo_core.plugin.placement import PlacementOption, PlacementRequest


@hookimpl
def exo_engines(config: NodeConfig) -> list[Engine]:
    from exo_core.plugin.engine import derive_key
    from exo_engine_mflux.engine import MfluxEngine

    secret = derive_key(config.cluster_key, f"exo-mflux-ring:{config.namespace}")
    return [MfluxEngine(ring_secret=secret)]


@hookimpl
def exo_model_cards(config: NodeConfig) -> list[ModelCard]:
    from exo_engine_mflux.cards import local_image_cards

    return local_image_cards(config.models_dir)


@hookimpl
def exo_place_instance(
    card: ModelCard, request: PlacementRequest, state: State
) -> list[PlacementOption] | None:
    """Image models only; text models fall through to the other strategies."""
    if not card.makes_images:
        return None
    from exo_engine_mflux.placement import place_image_model

    return place_image_model(card, request, state)
