"""Where an image model runs: one node with the mflux engine and room for every component.

An image runner holds every component (text encoders, transformer, VAE) in fp32, so weights
stored in bf16 take twice their size in memory. Over several nodes (`min_nodes` > 1, or no
node holds it alone) the transformer's blocks are split pipeline-wise: every rank still holds
the encoders and the VAE (it runs the whole pipeline on the same seed, see `split.py`).
"""

from __future__ import annotations

from exo_core.plugin import ModelCard, NodeInfo, PlacementRefused, State
from exo_core.plugin.placement import (
    NodeShare,
    PlacementOption,
    PlacementRequest,
    human_bytes,
    split_layers,
)
from exo_engine_mflux.engine import split_refusal
from exo_engine_mflux.families import FAMILIES, pipeline_family

ENGINE = "mflux"


def _fp32(card: ModelCard, stored: int) -> int:
    return stored * 2 if card.quantization in ("bf16", "fp16") else stored


def memory_needed(card: ModelCard) -> int:
    """Bytes a runner of `card` holds: its components (or its whole size), as fp32."""
    stored = sum(c.storage_size_bytes for c in card.components) or card.storage_size_bytes
    return _fp32(card, stored)


def _fits(node: NodeInfo, needed: int) -> bool:
    return node.resources.memory_available >= needed


def _split_shares(card: ModelCard, nodes: list[NodeInfo]) -> tuple[NodeShare, ...]:
    """Every rank holds the encoders and the VAE, and its run of the transformer's blocks (in
    proportion to its free memory, one block at least)."""
    split = next(c for c in card.components if c.splittable)
    whole = sum(c.storage_size_bytes for c in card.components if not c.splittable)
    ranges = split_layers(split.n_blocks, [n.resources.memory_available for n in nodes])
    return tuple(
        NodeShare(
            node_id=n.node_id,
            start_layer=a,
            end_layer=b,
            memory_bytes=_fp32(
                card, whole + -(-split.storage_size_bytes * (b - a) // split.n_blocks)
            ),
        )
        for n, (a, b) in zip(nodes, ranges, strict=True)
    )


def _whole_options(card: ModelCard, engines: list[NodeInfo]) -> list[PlacementOption]:
    needed = memory_needed(card)
    fitting = sorted(
        (n for n in engines if _fits(n, needed)),
        key=lambda n: (-n.resources.memory_available, n.node_id),
    )
    return [
        PlacementOption(
            model_id=card.model_id,
            sharding="pipeline",
            shares=(
                NodeShare(
                    node_id=n.node_id, start_layer=0, end_layer=card.n_layers, memory_bytes=needed
                ),
            ),
        )
        for n in fitting
    ]


def _split_option(card: ModelCard, engines: list[NodeInfo], k: int) -> PlacementOption | None:
    """The transformer over the `k` nodes with the most free memory, if every share fits."""
    richest = sorted(engines, key=lambda n: (-n.resources.memory_available, n.node_id))[:k]
    shares = _split_shares(card, richest)
    by_id = {n.node_id: n for n in richest}
    if any(not _fits(by_id[s.node_id], s.memory_bytes) for s in shares):
        return None
    return PlacementOption(model_id=card.model_id, sharding="pipeline", shares=shares)


def place_image_model(
    card: ModelCard, request: PlacementRequest, state: State
) -> list[PlacementOption]:
    """Where `card` runs, or `PlacementRefused`: every node that holds it alone (most free
    memory first) unless `min_nodes` > 1; otherwise, or when no node holds it alone, its
    transformer split over the fewest nodes (with the most free memory) that hold it."""
    if pipeline_family(card) not in FAMILIES:
        raise PlacementRefused(
            f"the image engine does not run the model family '{pipeline_family(card)}' of "
            f"{card.model_id} yet (it runs {', '.join(sorted(FAMILIES))})"
        )
    if request.sharding == "tensor":
        raise PlacementRefused(f"{card.model_id} is an image model: it has no tensor parallel")
    engines = [n for n in state.nodes.values() if ENGINE in n.resources.engines]
    if not engines:
        raise PlacementRefused(
            f"no node runs the image engine (engine_mflux) that {card.model_id} needs"
        )
    if request.min_nodes > len(engines):
        raise PlacementRefused(
            f"min_nodes={request.min_nodes} but {len(engines)} node(s) run the image engine "
            f"(engine_mflux) that {card.model_id} needs"
        )
    if request.min_nodes <= 1:
        options = _whole_options(card, engines)
        if options:
            return options
    refusal: str | None = None
    for k in range(max(2, request.min_nodes), len(engines) + 1):
        refusal = split_refusal(card, k)
        if refusal is not None:
            break
        option = _split_option(card, engines, k)
        if option is not None:
            return [option]
    best = max(n.resources.memory_available for n in engines)
    parts = ", ".join(f"{c.name} {human_bytes(c.storage_size_bytes)}" for c in card.components)
    raise PlacementRefused(
        f"not enough free memory for {card.model_id}: it needs {human_bytes(memory_needed(card))} "
        f"in fp32 ({parts or 'one part'}), the node with the most free memory has "
        f"{human_bytes(best)}"
        + (f"; {refusal}" if refusal else "")
        + (
            "; split over several nodes, every node still holds the encoders and the VAE"
            if len(engines) > 1 and refusal is None
            else ""
        )
    )
