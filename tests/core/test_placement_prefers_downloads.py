"""Placement prefers the node that holds more of the model (exo_core.placement, pure)."""

from __future__ import annotations

from exo_core.ids import ModelId, NodeId
from exo_core.model_cards import ModelCard
from exo_core.placement import place
from exo_core.placement_types import PlacementRequest
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    NodeInfo,
    NodeResources,
    State,
)

MODEL = ModelId("org/tiny")
CARD = ModelCard(
    model_id=MODEL,
    family="llama",
    n_layers=4,
    hidden_size=64,
    storage_size_bytes=1_500_000,
    source="hf:org/tiny",
)
A, B = NodeId("node-a"), NodeId("node-b")


def state(downloads: dict[NodeId, DownloadProgress]) -> State:
    resources = NodeResources(memory_total=2**34, memory_available=2**33, engines=("mlx",))
    nodes = {n: NodeInfo(node_id=n, resources=resources) for n in (A, B)}
    return State(nodes=nodes, downloads={n: {MODEL: p} for n, p in downloads.items()})


def progress(node: NodeId, status: DownloadStatus, done: int = 0) -> DownloadProgress:
    return DownloadProgress(
        node_id=node, model_id=MODEL, status=status, downloaded_bytes=done, total_bytes=100
    )


def choices(s: State) -> list[tuple[NodeId, ...]]:
    options = place(CARD, PlacementRequest(model_id=MODEL, sharding="pipeline"), s)
    return [o.node_ids for o in options]


def first_choice(s: State) -> tuple[NodeId, ...]:
    return choices(s)[0]


def test_without_downloads_the_tie_goes_by_node_order() -> None:
    assert first_choice(state({})) == (A,)


def test_the_node_with_the_model_downloaded_wins() -> None:
    assert first_choice(state({B: progress(B, DownloadStatus.COMPLETED)})) == (B,)


def test_a_partial_download_wins_over_none() -> None:
    assert first_choice(state({B: progress(B, DownloadStatus.ONGOING, 60)})) == (B,)


def test_more_of_a_partial_download_ranks_higher() -> None:
    s = state(
        {
            A: progress(A, DownloadStatus.ONGOING, 30),
            B: progress(B, DownloadStatus.ONGOING, 60),
        }
    )
    singles = [c for c in choices(s) if len(c) == 1]
    assert singles == [(B,), (A,)]


def test_a_failed_download_counts_for_nothing() -> None:
    s = state(
        {
            A: progress(A, DownloadStatus.FAILED, 90),
            B: progress(B, DownloadStatus.ONGOING, 10),
        }
    )
    assert first_choice(s) == (B,)
