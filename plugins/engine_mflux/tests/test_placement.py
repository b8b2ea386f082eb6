"""Where image models go: one node with the image engine and room for every component, or
the transformer split over several (min_nodes > 1, or no node holds it alone)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from exo_core.plugin import (
    ModelCard,
    ModelId,
    NodeId,
    NodeInfo,
    NodeResources,
    PlacementRefused,
    State,
)
from exo_core.plugin.cards import load_card_file
from exo_core.plugin.placement import PlacementRequest
from exo_engine_mflux.placement import memory_needed, place_image_model

GB = 1_000_000_000
CARDS = Path(__file__).parents[3] / "resources" / "model_cards"


def _node(name: str, free_gb: float, engines: tuple[str, ...] = ("mlx", "mflux")) -> NodeInfo:
    resources = NodeResources(memory_available=int(free_gb * GB), engines=engines)
    return NodeInfo(node_id=NodeId(name), resources=resources)


def _state(*nodes: NodeInfo) -> State:
    return State(nodes={n.node_id: n for n in nodes})


def _schnell() -> ModelCard:
    return load_card_file(CARDS / "black-forest-labs--FLUX.1-schnell.toml")


def _request(card: ModelCard, **kw: object) -> PlacementRequest:
    return PlacementRequest(model_id=ModelId(card.model_id), **kw)  # type: ignore[arg-type]


def test_bf16_components_need_twice_their_size_in_fp32() -> None:
    card = _schnell()
    assert memory_needed(card) == 2 * sum(c.storage_size_bytes for c in card.components)
    assert sum(c.storage_size_bytes for c in card.components) == card.storage_size_bytes


def test_only_nodes_with_the_image_engine_and_room_are_offered() -> None:
    card = _schnell()
    state = _state(
        _node("a", 100), _node("b", 200, engines=("mlx",)), _node("c", 30), _node("d", 80)
    )
    options = place_image_model(card, _request(card), state)
    assert [o.node_ids for o in options] == [(NodeId("a"),), (NodeId("d"),)]
    assert options[0].shares[0].memory_bytes == memory_needed(card)


@pytest.mark.parametrize(
    ("nodes", "request_kw", "reason"),
    [
        ((_node("a", 30),), {}, "not enough free memory"),
        ((_node("a", 500, engines=("mlx",)),), {}, "no node runs the image engine"),
        ((_node("a", 500), _node("b", 500)), {"min_nodes": 3}, "min_nodes=3 but 2 node"),
        ((_node("a", 40), _node("b", 40)), {}, "every node still holds the encoders"),
        ((_node("a", 500),), {"sharding": "tensor"}, "no tensor parallel"),
    ],
)
def test_refusals_name_the_reason(
    nodes: tuple[NodeInfo, ...], request_kw: dict[str, object], reason: str
) -> None:
    card = _schnell()
    with pytest.raises(PlacementRefused, match=reason) as refused:
        place_image_model(card, _request(card, **request_kw), _state(*nodes))
    if reason.startswith("not enough"):
        assert "transformer 23.8 GB" in str(refused.value)


def test_families_the_engine_cannot_run_are_refused() -> None:
    card = msgspec.structs.replace(_schnell(), family="sdxl", model_type="sdxl")
    with pytest.raises(PlacementRefused, match="does not run the model family 'sdxl'"):
        place_image_model(card, _request(card), _state(_node("a", 500)))


@pytest.mark.parametrize("name", ["Qwen--Qwen-Image.toml", "Qwen--Qwen-Image-Edit.toml"])
def test_qwen_image_runs_on_one_node_or_its_transformer_split(name: str) -> None:
    from exo_engine_mflux.engine import MfluxEngine

    card = load_card_file(CARDS / name)
    assert MfluxEngine().can_serve(card)
    (option,) = place_image_model(card, _request(card), _state(_node("a", 500)))
    assert option.node_ids == (NodeId("a"),)
    # 115 GB in fp32: two 80 GB nodes hold it split, its 60 blocks 30 each.
    (split,) = place_image_model(card, _request(card), _state(_node("a", 80), _node("b", 80)))
    assert _transformer_blocks(split.shares) == [(0, 30), (30, 60)]


def _transformer_blocks(option_shares: object) -> list[tuple[int, int]]:
    return [(s.start_layer, s.end_layer) for s in option_shares]  # type: ignore[attr-defined]


def test_min_nodes_splits_the_transformer_and_every_rank_holds_the_rest() -> None:
    card = _schnell()
    state = _state(_node("a", 500), _node("b", 300), _node("c", 400, engines=("mlx",)))
    (option,) = place_image_model(card, _request(card, min_nodes=2), state)
    assert option.sharding == "pipeline"
    assert option.node_ids == (NodeId("a"), NodeId("b"))
    blocks = _transformer_blocks(option.shares)
    assert blocks[0][0] == 0 and blocks[-1][1] == 57 and blocks[0][1] == blocks[1][0]
    assert blocks[0][1] > 57 // 2  # more free memory, more blocks
    rest = 2 * sum(c.storage_size_bytes for c in card.components if c.name != "transformer")
    assert all(rest < s.memory_bytes < memory_needed(card) for s in option.shares)


def test_a_model_no_node_holds_alone_is_split() -> None:
    card = _schnell()  # 67 GB in fp32; half the transformer and the rest: ~43 GB
    (option,) = place_image_model(card, _request(card), _state(_node("a", 50), _node("b", 50)))
    assert len(option.shares) == 2


def test_the_engine_splits_the_transformer_only() -> None:
    from exo_engine_mflux.engine import MfluxEngine

    engine, card = MfluxEngine(), _schnell()
    assert engine.can_serve(card)
    assert engine.sharding_refusal(card, "pipeline", 1) is None
    assert engine.sharding_refusal(card, "pipeline", 2) is None
    assert "no tensor parallel" in (engine.sharding_refusal(card, "tensor", 2) or "")
    assert "too few for 58 nodes" in (engine.sharding_refusal(card, "pipeline", 58) or "")
