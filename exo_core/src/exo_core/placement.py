"""The default placement: which nodes run a model, and how it is split among them.

Rules, in order: a set of nodes must hold the model in free memory; tensor parallel needs the
hidden size and the KV heads to divide by the node count; then prefer nodes that already hold
(more of) the model, then the fewest nodes, then the most free memory.
"""

from __future__ import annotations

import itertools

from exo_core.ids import NodeId
from exo_core.model_cards import ModelCard
from exo_core.placement_types import (
    NodeShare,
    PlacementOption,
    PlacementRefused,
    PlacementRequest,
)
from exo_core.state import NodeInfo, Sharding, State

# Beyond this many nodes, subsets are not enumerated exhaustively (combinations explode).
MAX_ENUMERATED_NODES = 12


def split_layers(n_layers: int, weights: list[int]) -> list[tuple[int, int]]:
    """Split [0, n_layers) into contiguous ranges proportional to `weights`, at least one each."""
    k = len(weights)
    if k > n_layers:
        raise ValueError(f"cannot split {n_layers} layers over {k} nodes")
    total = sum(weights) or k
    counts = [max(1, round(n_layers * w / total)) for w in (weights if sum(weights) else [1] * k)]
    # Fix rounding so the counts add up, taking from (or giving to) the largest share.
    while sum(counts) > n_layers:
        i = max(range(k), key=lambda j: (counts[j], -j))
        counts[i] -= 1
    while sum(counts) < n_layers:
        i = max(range(k), key=lambda j: (weights[j] / counts[j], -j))
        counts[i] += 1
    ranges, start = [], 0
    for c in counts:
        ranges.append((start, start + c))
        start += c
    return ranges


def _download_score(state: State, card: ModelCard, nodes: tuple[NodeInfo, ...]) -> float:
    return sum(
        p.fraction
        for n in nodes
        if (p := state.downloads.get(n.node_id, {}).get(card.model_id)) is not None
    )


def _option(card: ModelCard, sharding: Sharding, nodes: tuple[NodeInfo, ...]) -> PlacementOption:
    if sharding == "tensor":
        per_node = card.storage_size_bytes // len(nodes)
        shares = [
            NodeShare(
                node_id=n.node_id, start_layer=0, end_layer=card.n_layers, memory_bytes=per_node
            )
            for n in nodes
        ]
    else:
        ranges = split_layers(card.n_layers, [n.resources.memory_available for n in nodes])
        shares = [
            NodeShare(
                node_id=n.node_id,
                start_layer=a,
                end_layer=b,
                memory_bytes=card.storage_size_bytes * (b - a) // card.n_layers,
            )
            for n, (a, b) in zip(nodes, ranges, strict=True)
        ]
    return PlacementOption(model_id=card.model_id, sharding=sharding, shares=tuple(shares))


def _fits(option: PlacementOption, nodes: dict[NodeId, NodeInfo]) -> bool:
    return all(s.memory_bytes <= nodes[s.node_id].resources.memory_available for s in option.shares)


def place(card: ModelCard, request: PlacementRequest, state: State) -> list[PlacementOption]:
    """Every valid placement, best first. Raises `PlacementRefused` naming what failed."""
    nodes = sorted(
        (n for n in state.nodes.values() if n.resources.engines),
        key=lambda n: n.node_id,
    )
    if not nodes:
        raise PlacementRefused("no node with an inference engine is in the cluster")
    by_id = {n.node_id: n for n in nodes}
    shardings: list[Sharding] = [request.sharding] if request.sharding else ["pipeline", "tensor"]
    options: list[tuple[tuple[float, int, int], PlacementOption]] = []
    reasons: set[str] = set()
    max_k = min(len(nodes), card.n_layers)
    if request.min_nodes > len(nodes):
        raise PlacementRefused(
            f"min_nodes={request.min_nodes} but the cluster has {len(nodes)} node(s) with an engine"
        )
    for sharding in shardings:
        if sharding == "tensor" and not card.supports_tensor:
            reasons.add(f"{card.model_id} does not support tensor parallel")
            continue
        for k in range(max(1, request.min_nodes), max_k + 1):
            if sharding == "tensor":
                if card.hidden_size % k:
                    reasons.add(f"hidden size {card.hidden_size} does not divide by {k} nodes")
                    continue
                kv = card.num_key_value_heads
                if kv is not None and kv % k:
                    reasons.add(f"{kv} KV heads do not divide by {k} nodes")
                    continue
            subsets = (
                itertools.combinations(nodes, k)
                if len(nodes) <= MAX_ENUMERATED_NODES
                else [tuple(sorted(nodes, key=lambda n: -n.resources.memory_available)[:k])]
            )
            for subset in subsets:
                option = _option(card, sharding, subset)
                if not _fits(option, by_id):
                    free = sum(n.resources.memory_available for n in subset)
                    reasons.add(
                        f"not enough free memory: the model needs {card.storage_size_bytes} "
                        f"bytes, {k} node(s) have at most {free} free"
                        if k == max_k
                        else "not enough free memory on smaller node sets"
                    )
                    continue
                free = sum(n.resources.memory_available for n in subset)
                key = (-_download_score(state, card, subset), k, -free)
                options.append((key, option))
    if not options:
        raise PlacementRefused("; ".join(sorted(reasons)) or "no placement fits")
    options.sort(key=lambda pair: pair[0])
    return [option for _, option in options]
