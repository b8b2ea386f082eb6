"""The default placement: which nodes run a model, and how it is split among them.

Rules, in order:
1. Only nodes with an inference engine; at least `min_nodes` of them.
2. A set of nodes must hold the model in free memory: a pipeline puts each node's layers on it
   (layers split in proportion to free memory, at least one each); tensor parallel puts an equal
   slice on every node.
3. Tensor parallel only where the hidden size and the KV heads divide by the node count.
4. Among the sets that fit, prefer those that already hold (more of) the model, then the
   fewest nodes, then sets whose nodes are directly connected, then the most free memory.

A refusal names every constraint that ruled sets out, in plain words.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

from exo_core.ids import NodeId
from exo_core.model_cards import ModelCard
from exo_core.placement_types import (
    NodeShare,
    PlacementOption,
    PlacementRefused,
    PlacementRequest,
)
from exo_core.state import Instance, NodeInfo, Sharding, State

# Beyond this many nodes, subsets are not enumerated exhaustively (combinations explode): only
# the nodes with the most free memory are tried, k at a time.
MAX_ENUMERATED_NODES = 12


def split_layers(n_layers: int, weights: Sequence[int]) -> list[tuple[int, int]]:
    """Split [0, n_layers) into contiguous ranges in proportion to `weights`, one or more
    layers each (largest remainders; ties to the earlier rank)."""
    k = len(weights)
    if k == 0 or k > n_layers:
        raise ValueError(f"cannot split {n_layers} layers over {k} nodes")
    total = sum(weights)
    shares = [w / total * n_layers for w in weights] if total > 0 else [n_layers / k] * k
    counts = [int(s) for s in shares]
    by_remainder = sorted(range(k), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in by_remainder[: n_layers - sum(counts)]:
        counts[i] += 1
    # Every node runs at least one layer: take from the node furthest above its share.
    for i in range(k):
        if counts[i] == 0:
            donor = max(
                (j for j in range(k) if counts[j] > 1), key=lambda j: (counts[j] - shares[j], -j)
            )
            counts[donor] -= 1
            counts[i] = 1
    ranges, start = [], 0
    for c in counts:
        ranges.append((start, start + c))
        start += c
    return ranges


def human_bytes(n: float) -> str:
    """A byte count for people: `1.5 GB`."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _missing(state: State, card: ModelCard, nodes: Iterable[NodeInfo]) -> float:
    """How much of the model the nodes still lack, in model copies (0: all hold it)."""
    total = 0.0
    for n in nodes:
        progress = state.downloads.get(n.node_id, {}).get(card.model_id)
        total += 1.0 - (progress.fraction if progress is not None else 0.0)
    return round(total, 6)


def _unlinked_pairs(state: State, nodes: Sequence[NodeInfo]) -> int:
    """Pairs of nodes with no direct transport link (from reported topology; unknown: linked)."""
    reported = state.topology
    count = 0
    for a, b in itertools.combinations(nodes, 2):
        if a.node_id not in reported or b.node_id not in reported:
            continue
        if b.node_id not in reported[a.node_id] and a.node_id not in reported[b.node_id]:
            count += 1
    return count


def _option(card: ModelCard, sharding: Sharding, nodes: Sequence[NodeInfo]) -> PlacementOption:
    if sharding == "tensor":
        per_node = -(-card.storage_size_bytes // len(nodes))
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
                memory_bytes=-(-card.storage_size_bytes * (b - a) // card.n_layers),
            )
            for n, (a, b) in zip(nodes, ranges, strict=True)
        ]
    return PlacementOption(model_id=card.model_id, sharding=sharding, shares=tuple(shares))


def _fits(option: PlacementOption, nodes: dict[NodeId, NodeInfo]) -> bool:
    return all(s.memory_bytes <= nodes[s.node_id].resources.memory_available for s in option.shares)


def _tensor_blocker(card: ModelCard, k: int) -> str | None:
    """Why tensor parallel cannot split this model over `k` nodes, or None."""
    if k == 1:
        return None
    problems = []
    if card.hidden_size % k:
        problems.append(f"hidden size {card.hidden_size}")
    kv = card.num_key_value_heads
    if kv is not None and kv % k:
        problems.append(f"{kv} KV heads")
    if not problems:
        return None
    return f"tensor parallel over {k} nodes: {' and '.join(problems)} do not divide by {k}"


def _subsets(nodes: list[NodeInfo], k: int) -> Iterable[tuple[NodeInfo, ...]]:
    if len(nodes) <= MAX_ENUMERATED_NODES:
        return itertools.combinations(nodes, k)
    richest = sorted(nodes, key=lambda n: (-n.resources.memory_available, n.node_id))[:k]
    return [tuple(sorted(richest, key=lambda n: n.node_id))]


class _Refusals:
    """Why node sets were ruled out, to name in a refusal."""

    def __init__(self, card: ModelCard) -> None:
        self.card = card
        self.reasons: list[str] = []
        self.best_free: dict[Sharding, int] = {}

    def add(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    def short_of_memory(self, sharding: Sharding, nodes: Sequence[NodeInfo]) -> None:
        free = [n.resources.memory_available for n in nodes]
        # What the set could hold: all its free memory, or for equal slices k times its least.
        capacity = min(free) * len(free) if sharding == "tensor" else sum(free)
        self.best_free[sharding] = max(self.best_free.get(sharding, 0), capacity)

    def message(self) -> str:
        parts = list(self.reasons)
        size = human_bytes(self.card.storage_size_bytes)
        for sharding, free in self.best_free.items():
            parts.append(
                f"not enough free memory for {sharding} parallel: {self.card.model_id} needs "
                f"{size}, the best set of nodes can hold {human_bytes(free)}"
                + (" (every node holds an equal slice)" if sharding == "tensor" else "")
            )
        return "; ".join(parts) or "no placement fits"


def can_serve(node: NodeInfo, card: ModelCard, state: State) -> bool:
    """Whether `node`'s engines can serve `card`, as its telemetry says. A custom card added
    through the API may be newer than the node's last report: any node with an engine may
    serve it. (A plugin's card replicated at placement is not custom: only nodes that report
    it can serve it.)"""
    serves = node.resources.serves
    return bool(node.resources.engines) and (
        serves is None
        or card.model_id in serves
        or (card.custom and card.model_id in state.model_cards)
    )


def place(card: ModelCard, request: PlacementRequest, state: State) -> list[PlacementOption]:
    """Every valid placement, best first. Raises `PlacementRefused` naming what failed."""
    with_engine = [n for n in state.nodes.values() if n.resources.engines]
    if not with_engine:
        raise PlacementRefused("no node with an inference engine is in the cluster")
    nodes = sorted((n for n in with_engine if can_serve(n, card, state)), key=lambda n: n.node_id)
    if not nodes:
        raise PlacementRefused(
            f"no node in the cluster has an engine that can serve {card.model_id}"
        )
    if request.min_nodes > len(nodes):
        raise PlacementRefused(
            f"min_nodes={request.min_nodes} but the cluster has {len(nodes)} node(s) "
            "with an inference engine"
        )
    by_id = {n.node_id: n for n in nodes}
    shardings: list[Sharding] = [request.sharding] if request.sharding else ["pipeline", "tensor"]
    refusals = _Refusals(card)
    ranked: list[tuple[tuple[float, int, int, int], PlacementOption]] = []
    for sharding in shardings:
        if sharding == "tensor" and not card.supports_tensor:
            refusals.add(f"{card.model_id} does not support tensor parallel")
            continue
        if sharding == "pipeline" and request.min_nodes > card.n_layers:
            refusals.add(
                f"a pipeline needs at least one layer per node: {card.model_id} has "
                f"{card.n_layers} layers, fewer than min_nodes={request.min_nodes}"
            )
            continue
        max_k = min(len(nodes), card.n_layers) if sharding == "pipeline" else len(nodes)
        for k in range(max(1, request.min_nodes), max_k + 1):
            blocker = _tensor_blocker(card, k) if sharding == "tensor" else None
            if blocker:
                refusals.add(blocker)
                continue
            for subset in _subsets(nodes, k):
                option = _option(card, sharding, subset)
                if not _fits(option, by_id):
                    refusals.short_of_memory(sharding, subset)
                    continue
                free = sum(n.resources.memory_available for n in subset)
                key = (_missing(state, card, subset), k, _unlinked_pairs(state, subset), -free)
                ranked.append((key, option))
    if not ranked:
        raise PlacementRefused(refusals.message())
    ranked.sort(key=lambda pair: pair[0])  # stable: pipeline before tensor on equal keys
    return [option for _, option in ranked]


def runnable(
    options: list[PlacementOption], refusal: Callable[[PlacementOption], str | None]
) -> list[PlacementOption]:
    """The options the engines can run (`refusal` says why one cannot), in their order.
    Raises `PlacementRefused` with the engines' reasons when none is left."""
    kept: list[PlacementOption] = []
    reasons: list[str] = []
    for option in options:
        reason = refusal(option)
        if reason is None:
            kept.append(option)
        elif reason not in reasons:
            reasons.append(reason)
    if options and not kept:
        raise PlacementRefused("; ".join(reasons))
    return kept


def including(options: list[PlacementOption], node_ids: Iterable[str]) -> list[PlacementOption]:
    """The options that run on every node of `node_ids` (all of them when it is empty), in
    their order. Raises `PlacementRefused` when options were found but none includes them."""
    wanted = set(node_ids)
    if not wanted:
        return options
    kept = [o for o in options if wanted <= {s.node_id for s in o.shares}]
    if options and not kept:
        raise PlacementRefused(
            f"no placement that fits includes every node asked for ({', '.join(sorted(wanted))})"
        )
    return kept


PlaceFn = Callable[[ModelCard, PlacementRequest, State], list[PlacementOption]]


def replacement_options(
    card: ModelCard, lost: Instance, state: State, place_fn: PlaceFn = place
) -> list[PlacementOption]:
    """Where to run an instance again after it lost a node (`state` no longer has the node):
    its own sharding first, then any; [] when nothing fits on the nodes left.

    A three-node tensor group left with two nodes may not divide the KV heads any more, and
    then a pipeline (or one node) serves instead."""
    for sharding in (lost.sharding, None):
        try:
            return place_fn(
                card, PlacementRequest(model_id=lost.model_id, sharding=sharding), state
            )
        except PlacementRefused:
            continue
    return []
