"""Types of the placement hook: what is asked, what is offered, why nothing fits."""

from __future__ import annotations

import msgspec

from exo_core.ids import ModelId, NodeId
from exo_core.state import Sharding


class PlacementRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a caller asks of a placement: the model, a sharding, how many nodes, which."""

    model_id: ModelId
    # None: any sharding; otherwise only that one.
    sharding: Sharding | None = None
    min_nodes: int = 1
    # Nodes every offered placement must include (exo's `node_ids`); empty: any nodes.
    node_ids: tuple[NodeId, ...] = ()


class NodeShare(msgspec.Struct, frozen=True, kw_only=True):
    """One node's part of a placement: its layers and the memory they take."""

    node_id: NodeId
    start_layer: int
    end_layer: int
    memory_bytes: int


class PlacementOption(msgspec.Struct, frozen=True, kw_only=True):
    """One valid way to run the model; `shares` are in rank order."""

    model_id: ModelId
    sharding: Sharding
    shares: tuple[NodeShare, ...]

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        return tuple(s.node_id for s in self.shares)


class PlacementRefused(Exception):
    """No placement fits; the message names the constraint that failed."""
