"""Placement (the `exo_place_instance` hook): the request, the options, the core's own
placement to build on, and the layer split."""

from __future__ import annotations

from exo_core.placement import human_bytes, place, runnable, split_layers
from exo_core.placement_types import NodeShare, PlacementOption, PlacementRequest

__all__ = [
    "NodeShare",
    "PlacementOption",
    "PlacementRequest",
    "human_bytes",
    "place",
    "runnable",
    "split_layers",
]
