"""The default placement strategy, registered `trylast` so any plugin's strategy runs first."""

from __future__ import annotations

from exo_core import placement
from exo_core.hookspecs import hookimpl
from exo_core.model_cards import ModelCard
from exo_core.placement_types import PlacementOption, PlacementRefused, PlacementRequest
from exo_core.state import State


@hookimpl(trylast=True)
def exo_place_instance(
    card: ModelCard, request: PlacementRequest, state: State
) -> list[PlacementOption]:
    if card.makes_images:
        # An image engine plugin places its models itself; without one, no node can run it.
        raise PlacementRefused(
            f"{card.model_id} is an image model and no image engine plugin (engine_mflux) "
            "places it on this cluster"
        )
    return placement.place(card, request, state)
