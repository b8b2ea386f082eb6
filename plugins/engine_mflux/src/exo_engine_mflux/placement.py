"""Where an image model runs: one node with the mflux engine and room for every component.

An image runner holds every component (text encoders, transformer, VAE) in fp32, so weights
stored in bf16 take twice their size in memory. Splitting the transformer over several nodes
is not built yet: a request for more than one node is refused with that reason.
"""

from __future__ import annotations

from exo_core.model_cards import ModelCard
from exo_core.placement import human_bytes
from exo_core.placement_types import NodeShare, PlacementOption, PlacementRefused, PlacementRequest
from exo_core.state import NodeInfo, State
from exo_engine_mflux.engine import FAMILIES

ENGINE = "mflux"


def memory_needed(card: ModelCard) -> int:
    """Bytes a runner of `card` holds: its components (or its whole size), as fp32."""
    stored = sum(c.storage_size_bytes for c in card.components) or card.storage_size_bytes
    return stored * 2 if card.quantization in ("bf16", "fp16") else stored


def _fits(node: NodeInfo, needed: int) -> bool:
    return node.resources.memory_available >= needed


def place_image_model(
    card: ModelCard, request: PlacementRequest, state: State
) -> list[PlacementOption]:
    """Every node that can run `card` alone, most free memory first; or `PlacementRefused`."""
    if card.family not in FAMILIES:
        raise PlacementRefused(
            f"the image engine does not run the model family '{card.family}' of "
            f"{card.model_id} yet (it runs {', '.join(sorted(FAMILIES))})"
        )
    if request.sharding == "tensor":
        raise PlacementRefused(f"{card.model_id} is an image model: it has no tensor parallel")
    if request.min_nodes > 1:
        raise PlacementRefused(
            f"{card.model_id} is an image model: splitting it over {request.min_nodes} nodes "
            "is not supported yet; it runs on one node"
        )
    engines = [n for n in state.nodes.values() if ENGINE in n.resources.engines]
    if not engines:
        raise PlacementRefused(
            f"no node runs the image engine (engine_mflux) that {card.model_id} needs"
        )
    needed = memory_needed(card)
    fitting = sorted(
        (n for n in engines if _fits(n, needed)),
        key=lambda n: (-n.resources.memory_available, n.node_id),
    )
    if not fitting:
        best = max(n.resources.memory_available for n in engines)
        parts = ", ".join(f"{c.name} {human_bytes(c.storage_size_bytes)}" for c in card.components)
        raise PlacementRefused(
            f"not enough free memory for {card.model_id}: it needs {human_bytes(needed)} in "
            f"fp32 ({parts or 'one part'}), the node with the most free memory has "
            f"{human_bytes(best)}"
        )
    return [
        PlacementOption(
            model_id=card.model_id,
            sharding="pipeline",
            shares=(
                NodeShare(
                    node_id=n.node_id,
                    start_layer=0,
                    end_layer=card.n_layers,
                    memory_bytes=needed,
                ),
            ),
        )
        for n in fitting
    ]
