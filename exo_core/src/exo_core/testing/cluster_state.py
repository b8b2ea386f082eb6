"""Cluster states for placement tests: nodes that differ only in free memory."""

from __future__ import annotations

from collections.abc import Sequence

from exo_core.ids import NodeId
from exo_core.state import NodeInfo, NodeResources, State


def nodes_with_free_memory(free_gb: Sequence[float], engines: tuple[str, ...] = ("mlx",)) -> State:
    """One loopback node `n<i>` per entry, with that many GB (10^9 bytes) free."""
    nodes = [
        NodeInfo(
            node_id=NodeId(f"n{i}"),
            addresses=("127.0.0.1",),
            resources=NodeResources(memory_available=int(gb * 1_000_000_000), engines=engines),
        )
        for i, gb in enumerate(free_gb)
    ]
    return State(nodes={n.node_id: n for n in nodes})
