"""The default placement and the instance built from it: pure functions over state."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_core.commands import PlaceInstance
from exo_core.decide import (
    RING_PORT_BASE,
    RING_PORT_SPAN,
    CommandRefused,
    MasterContext,
    build_instance,
    decide,
    ring_host,
    ring_ports,
)
from exo_core.events import IndexedEvent, InstanceCreated, ModelCardAdded
from exo_core.ids import InstanceId, ModelId, NodeId
from exo_core.model_cards import ModelCard
from exo_core.placement import place, replacement_options, split_layers
from exo_core.placement_types import PlacementRefused, PlacementRequest
from exo_core.reducer import apply
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    NodeInfo,
    NodeResources,
    Sharding,
    State,
)

GB = 1_000_000_000
SMOLLM = ModelCard(
    model_id=ModelId("smollm"),
    family="llama",
    n_layers=30,
    hidden_size=576,
    num_key_value_heads=3,
    storage_size_bytes=3 * GB,
    supports_tensor=True,
)


def node(name: str, free_gb: float, engines: tuple[str, ...] = ("mlx",), *addrs: str) -> NodeInfo:
    return NodeInfo(
        node_id=NodeId(name),
        addresses=addrs or ("127.0.0.1",),
        resources=NodeResources(memory_available=int(free_gb * GB), engines=engines),
    )


def state(*nodes: NodeInfo, **kwargs: object) -> State:
    return State(nodes={n.node_id: n for n in nodes}, **kwargs)  # type: ignore[arg-type]


def request(sharding: Sharding | None = None, min_nodes: int = 1) -> PlacementRequest:
    return PlacementRequest(model_id=SMOLLM.model_id, sharding=sharding, min_nodes=min_nodes)


def downloaded(node_id: str, status: DownloadStatus, done: int = 0, total: int = 0) -> dict:
    progress = DownloadProgress(
        node_id=NodeId(node_id),
        model_id=SMOLLM.model_id,
        status=status,
        downloaded_bytes=done,
        total_bytes=total,
    )
    return {NodeId(node_id): {SMOLLM.model_id: progress}}


def nodes_of(option: object) -> list[str]:
    return list(option.node_ids)  # type: ignore[attr-defined]


# -- layer split ------------------------------------------------------------------------------


@given(
    st.integers(1, 120).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.integers(0, 10**12), min_size=1, max_size=min(n, 12))
        )
    )
)
def test_split_layers_is_contiguous_covers_all_and_gives_each_node_one(
    case: tuple[int, list[int]],
) -> None:
    n_layers, weights = case
    ranges = split_layers(n_layers, weights)
    assert len(ranges) == len(weights)
    assert ranges[0][0] == 0 and ranges[-1][1] == n_layers
    assert all(a < b for a, b in ranges)
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=8), st.integers(8, 200))
def test_split_layers_is_proportional_to_weights(weights: list[int], n_layers: int) -> None:
    ranges = split_layers(n_layers, weights)
    total = sum(weights)
    ideals = [n_layers * w / total for w in weights]
    # Nodes whose share is under one layer are lifted to one, taken from the larger shares.
    lifted = sum(1 for ideal in ideals if ideal < 1)
    for (a, b), ideal in zip(ranges, ideals, strict=True):
        assert b - a >= 1
        if ideal >= 1:
            # Largest remainders: within one layer of the ideal, less what the lift took.
            assert abs((b - a) - ideal) < 1 + lifted


def test_split_layers_examples() -> None:
    assert split_layers(30, [1, 1, 1]) == [(0, 10), (10, 20), (20, 30)]
    assert split_layers(30, [2, 1]) == [(0, 20), (20, 30)]
    assert split_layers(4, [1000, 1, 1]) == [(0, 2), (2, 3), (3, 4)]
    assert split_layers(3, [0, 0, 0]) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError):
        split_layers(2, [1, 1, 1])


# -- memory -----------------------------------------------------------------------------------


def test_one_node_that_holds_the_model_is_preferred_to_several() -> None:
    options = place(SMOLLM, request(), state(node("a", 8), node("b", 8)))
    assert nodes_of(options[0]) == ["a"] or nodes_of(options[0]) == ["b"]
    assert options[0].sharding == "pipeline"
    assert len(options[0].shares) == 1


def test_a_model_too_big_for_any_node_is_split_in_proportion_to_free_memory() -> None:
    options = place(SMOLLM, request("pipeline"), state(node("a", 2), node("b", 1)))
    best = options[0]
    assert nodes_of(best) == ["a", "b"]
    assert [(s.start_layer, s.end_layer) for s in best.shares] == [(0, 20), (20, 30)]
    assert [s.memory_bytes for s in best.shares] == [2 * GB, 1 * GB]


def test_no_set_with_enough_memory_is_refused_naming_memory() -> None:
    with pytest.raises(PlacementRefused) as e:
        place(SMOLLM, request("pipeline"), state(node("a", 1), node("b", 1)))
    message = str(e.value)
    assert "not enough free memory" in message and "3.0 GB" in message, message
    assert "2.0 GB" in message, message


def test_tensor_needs_an_equal_slice_on_every_node() -> None:
    # 3 GB over three nodes: 1 GB each; node c has only 0.5 GB.
    nodes = state(node("a", 4), node("b", 4), node("c", 0.5))
    with pytest.raises(PlacementRefused) as e:
        place(SMOLLM, request("tensor", min_nodes=3), nodes)
    assert "equal slice" in str(e.value)


def test_nodes_without_an_engine_are_not_used() -> None:
    options = place(SMOLLM, request(), state(node("a", 8, ()), node("b", 8)))
    assert all("a" not in nodes_of(o) for o in options)
    with pytest.raises(PlacementRefused, match="no node with an inference engine"):
        place(SMOLLM, request(), state(node("a", 8, ())))


def serving(name: str, free_gb: float, serves: tuple[str, ...]) -> NodeInfo:
    resources = NodeResources(
        memory_available=int(free_gb * GB),
        engines=("mlx",),
        serves=tuple(ModelId(m) for m in serves),
    )
    return NodeInfo(node_id=NodeId(name), addresses=("127.0.0.1",), resources=resources)


def test_only_nodes_whose_engines_serve_the_card_are_used() -> None:
    nodes = state(serving("a", 8, ("other",)), serving("b", 8, ("smollm",)), node("c", 1))
    options = place(SMOLLM, request(), nodes)
    assert {tuple(nodes_of(o)) for o in options} == {("b",), ("b", "c")}  # c did not report
    with pytest.raises(PlacementRefused, match="no node in the cluster has an engine that can"):
        place(SMOLLM, request(), state(serving("a", 8, ("other",))))


def test_a_master_without_the_card_places_with_the_card_the_request_carries() -> None:
    nodes = state(serving("a", 8, ("smollm",)), serving("b", 16, ()))
    ctx = MasterContext(card=lambda m: None, place=place)
    with pytest.raises(CommandRefused, match="unknown model"):
        decide(nodes, PlaceInstance(model_id=SMOLLM.model_id), ctx)
    with pytest.raises(CommandRefused, match="the card is for"):
        decide(nodes, PlaceInstance(model_id=ModelId("other"), card=SMOLLM), ctx)
    decision = decide(nodes, PlaceInstance(model_id=SMOLLM.model_id, card=SMOLLM), ctx)
    # The card is replicated, so every node (and a later master) knows the model...
    shared, created = decision.events
    assert shared == ModelCardAdded(card=SMOLLM)
    assert isinstance(created, InstanceCreated)
    assert [s.node_id for s in created.instance.shards] == ["a"]
    # ...and, not being a custom card, it still goes only to nodes that report serving it.
    after = apply(nodes, IndexedEvent(index=0, term=0, event=shared))
    assert {tuple(nodes_of(o)) for o in place(SMOLLM, request(), after)} == {("a",)}


# -- tensor divisibility ----------------------------------------------------------------------


def test_tensor_over_two_nodes_is_refused_for_three_kv_heads() -> None:
    with pytest.raises(PlacementRefused) as e:
        place(SMOLLM, request("tensor", min_nodes=2), state(node("a", 8), node("b", 8)))
    message = str(e.value)
    assert "3 KV heads do not divide by 2" in message, message


def test_tensor_over_three_nodes_fits_three_kv_heads() -> None:
    options = place(
        SMOLLM, request("tensor", min_nodes=3), state(node("a", 8), node("b", 8), node("c", 8))
    )
    assert [o.sharding for o in options] == ["tensor"]
    assert all((s.start_layer, s.end_layer) == (0, 30) for s in options[0].shares)
    assert [s.memory_bytes for s in options[0].shares] == [GB, GB, GB]


def test_tensor_needs_the_hidden_size_to_divide_too() -> None:
    card = ModelCard(
        model_id=SMOLLM.model_id, family="llama", n_layers=30, hidden_size=575,
        num_key_value_heads=None, storage_size_bytes=GB, supports_tensor=True,
    )  # fmt: skip
    with pytest.raises(PlacementRefused, match="hidden size 575 do not divide by 2"):
        place(card, request("tensor", min_nodes=2), state(node("a", 8), node("b", 8)))


def test_both_constraints_named_when_both_fail() -> None:
    card = ModelCard(
        model_id=SMOLLM.model_id, family="llama", n_layers=30, hidden_size=575,
        num_key_value_heads=3, storage_size_bytes=GB, supports_tensor=True,
    )  # fmt: skip
    with pytest.raises(PlacementRefused, match="hidden size 575 and 3 KV heads"):
        place(card, request("tensor", min_nodes=2), state(node("a", 8), node("b", 8)))


def test_a_card_without_tensor_support_gets_no_tensor_option() -> None:
    card = ModelCard(
        model_id=SMOLLM.model_id, family="llama", n_layers=30, hidden_size=576,
        storage_size_bytes=GB, supports_tensor=False,
    )  # fmt: skip
    assert all(o.sharding == "pipeline" for o in place(card, request(), state(node("a", 8))))
    with pytest.raises(PlacementRefused, match="does not support tensor parallel"):
        place(card, request("tensor"), state(node("a", 8)))


# -- preferences ------------------------------------------------------------------------------


def test_a_node_that_holds_the_model_beats_one_with_more_memory() -> None:
    s = state(node("a", 4), node("b", 16), downloads=downloaded("a", DownloadStatus.COMPLETED))
    assert nodes_of(place(SMOLLM, request(), s)[0]) == ["a"]


def test_more_download_progress_is_preferred() -> None:
    downloads = {
        **downloaded("a", DownloadStatus.ONGOING, 1, 10),
        **downloaded("b", DownloadStatus.ONGOING, 6, 10),
    }
    s = state(node("a", 16), node("b", 4), downloads=downloads)
    assert nodes_of(place(SMOLLM, request(), s)[0]) == ["b"]


def test_a_failed_download_counts_as_nothing() -> None:
    s = state(node("a", 4), node("b", 16), downloads=downloaded("a", DownloadStatus.FAILED, 9, 10))
    assert nodes_of(place(SMOLLM, request(), s)[0]) == ["b"]


def test_nodes_holding_the_model_beat_fewer_nodes_that_must_download() -> None:
    downloads = {
        **downloaded("a", DownloadStatus.COMPLETED),
        **downloaded("b", DownloadStatus.COMPLETED),
    }
    s = state(node("a", 2), node("b", 2), node("c", 16), downloads=downloads)
    assert nodes_of(place(SMOLLM, request(), s)[0]) == ["a", "b"]


def test_most_free_memory_breaks_ties() -> None:
    options = place(SMOLLM, request("pipeline"), state(node("a", 4), node("b", 9), node("c", 6)))
    assert [nodes_of(o) for o in options[:3]] == [["b"], ["c"], ["a"]]


def test_directly_linked_nodes_are_preferred_when_topology_is_known() -> None:
    topology = {NodeId("a"): (NodeId("c"),), NodeId("b"): (), NodeId("c"): (NodeId("a"),)}
    s = state(node("a", 2), node("b", 2.5), node("c", 2), topology=topology)
    assert nodes_of(place(SMOLLM, request("pipeline", min_nodes=2), s)[0]) == ["a", "c"]


# -- min_nodes, previews ----------------------------------------------------------------------


def test_min_nodes_is_honoured() -> None:
    options = place(SMOLLM, request(min_nodes=2), state(node("a", 8), node("b", 8)))
    assert options and all(len(o.shares) >= 2 for o in options)
    with pytest.raises(PlacementRefused, match="min_nodes=3 but the cluster has 2"):
        place(SMOLLM, request(min_nodes=3), state(node("a", 8), node("b", 8)))


def test_min_nodes_beyond_the_layer_count_is_refused_for_a_pipeline() -> None:
    card = ModelCard(
        model_id=SMOLLM.model_id, family="llama", n_layers=2, hidden_size=64,
        storage_size_bytes=GB,
    )  # fmt: skip
    nodes = state(node("a", 8), node("b", 8), node("c", 8))
    with pytest.raises(PlacementRefused, match="at least one layer per node"):
        place(card, request("pipeline", min_nodes=3), nodes)


def test_every_valid_placement_is_listed() -> None:
    options = place(SMOLLM, request(), state(node("a", 8), node("b", 8), node("c", 8)))
    pipelines = [o for o in options if o.sharding == "pipeline"]
    tensors = [o for o in options if o.sharding == "tensor"]
    assert len(pipelines) == 3 + 3 + 1  # every subset of one, two and three nodes
    assert sorted(len(o.shares) for o in tensors) == [1, 1, 1, 3]  # 2 does not divide 3 KV heads
    assert [len(o.shares) for o in options] == sorted(len(o.shares) for o in options)


# -- the instance -----------------------------------------------------------------------------


def test_build_instance_gives_ranks_layers_and_distinct_ring_ports() -> None:
    s = state(node("a", 2), node("b", 1))
    option = place(SMOLLM, request("pipeline"), s)[0]
    first = build_instance(s, option, InstanceId("inst-1"))
    assert [(x.rank, x.world_size) for x in first.shards] == [(0, 2), (1, 2)]
    assert [(x.start_layer, x.end_layer) for x in first.shards] == [(0, 20), (20, 30)]
    ports = [int(x.ring_address.rsplit(":", 1)[1]) for x in first.shards]
    assert len(set(ports)) == 2
    assert all(RING_PORT_BASE <= p < RING_PORT_BASE + RING_PORT_SPAN for p in ports)
    with_first = State(nodes=s.nodes, instances={first.instance_id: first})
    second = build_instance(with_first, option, InstanceId("inst-2"))
    assert not {x.ring_address for x in second.shards} & {x.ring_address for x in first.shards}


def test_a_single_rank_instance_has_no_ring() -> None:
    s = state(node("a", 8))
    instance = build_instance(s, place(SMOLLM, request(), s)[0], InstanceId("solo"))
    assert [x.ring_address for x in instance.shards] == [""]


def test_ring_ports_depend_on_the_instance_so_a_replacement_moves_on() -> None:
    empty = State()
    assert ring_ports(empty, 2, "inst-a") == ring_ports(empty, 2, "inst-a")
    assert ring_ports(empty, 2, "inst-a") != ring_ports(empty, 2, "inst-b")


def test_ring_host_picks_an_address_on_a_peers_subnet() -> None:
    me = node("a", 1, ("mlx",), "172.17.0.1", "192.168.1.5", "127.0.0.1")
    peer = node("b", 1, ("mlx",), "192.168.1.7", "127.0.0.1")
    assert ring_host(me, [peer]) == "192.168.1.5"
    stranger = node("c", 1, ("mlx",), "10.9.0.3", "127.0.0.1")
    assert ring_host(me, [stranger]) == "172.17.0.1"  # loopback is never a shared subnet
    assert ring_host(node("d", 1), [peer]) == "127.0.0.1"


def test_a_tensor_group_that_lost_a_node_is_replaced_by_what_fits() -> None:
    s = state(node("a", 8), node("b", 8), node("c", 8))
    option = place(SMOLLM, request("tensor", min_nodes=3), s)[0]
    lost = build_instance(s, option, InstanceId("tensor-3"))
    left = state(node("a", 2), node("b", 2))  # c timed out; neither holds 3 GB alone
    options = replacement_options(SMOLLM, lost, left)
    assert options and options[0].sharding == "pipeline"  # 2 nodes cannot split 3 KV heads
    assert nodes_of(options[0]) == ["a", "b"]
    assert replacement_options(SMOLLM, lost, state(node("a", 1))) == []
