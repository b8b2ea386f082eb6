"""The trust rules of `exo_core.trust` and the master's decisions that use them (pure)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from exo_core.commands import AddModelCard, DeleteDownload, PlaceInstance
from exo_core.decide import CommandRefused, MasterContext, decide, decide_node_timeout
from exo_core.events import InstanceCreated
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId
from exo_core.model_cards import ModelCard
from exo_core.placement import place
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    Instance,
    NodeInfo,
    NodeResources,
    RunnerInfo,
    RunnerStatus,
    ShardAssignment,
    State,
)
from exo_core.trust import (
    MAX_PLAUSIBLE_MEMORY,
    RunRefused,
    card_to_run,
    instances_using,
    placement_view,
    resources_refusal,
)

GIB = 1 << 30
BUILTIN = ModelCard(
    model_id=ModelId("SmolLM2-135M-Instruct"),
    family="llama",
    n_layers=30,
    hidden_size=576,
    storage_size_bytes=100 << 20,
    source="embedded:smollm2",
)
HUB = ModelCard(
    model_id=ModelId("qwen"),
    family="qwen",
    n_layers=4,
    hidden_size=8,
    storage_size_bytes=GIB,
    source="hf:Org/Qwen-Tiny",
)


def node(name: str, memory: int = 16 * GIB) -> NodeInfo:
    return NodeInfo(
        node_id=NodeId(name),
        resources=NodeResources(memory_total=memory, memory_available=memory, engines=("mlx",)),
    )


def ctx(*cards: ModelCard, builtin: tuple[ModelCard, ...] = (BUILTIN,)) -> MasterContext:
    known = {c.model_id: c for c in (*cards, *builtin)}
    return MasterContext(
        card=known.get, place=place, builtin=frozenset(c.model_id for c in builtin)
    )


def on(node_id: str, model: ModelCard, runner_path: str = "") -> State:
    shard = ShardAssignment(
        node_id=NodeId(node_id), runner_id=RunnerId("r0"), rank=0, world_size=1,
        start_layer=0, end_layer=model.n_layers,
    )  # fmt: skip
    instance = Instance(
        instance_id=InstanceId("inst"), model_id=model.model_id, sharding="pipeline",
        shards=(shard,),
    )  # fmt: skip
    runner = RunnerInfo(
        runner_id=RunnerId("r0"), instance_id=InstanceId("inst"), node_id=NodeId(node_id),
        status=RunnerStatus.READY, model_path=runner_path,
    )  # fmt: skip
    return State(
        nodes={NodeId(node_id): node(node_id)},
        instances={instance.instance_id: instance},
        runners={runner.runner_id: runner},
    )


# -- cards ----------------------------------------------------------------------------------


def test_a_built_in_card_cannot_be_replaced_from_the_cluster() -> None:
    forged = msgspec.structs.replace(BUILTIN, source="local:/tmp/evil", trust_remote_code=True)
    with pytest.raises(CommandRefused) as refused:
        decide(State(), AddModelCard(card=forged), ctx())
    assert refused.value.status == 409 and "built-in" in refused.value.message
    # A new model's card is still accepted (as through POST /models/add).
    assert decide(State(), AddModelCard(card=HUB), ctx()).events


def test_remote_code_runs_only_for_models_the_operator_allowed(tmp_path: Path) -> None:
    asks = msgspec.structs.replace(HUB, trust_remote_code=True)
    with pytest.raises(RunRefused, match="--trust-remote-code qwen"):
        card_to_run(asks, own=False, roots=(tmp_path,), remote_code=())
    # Not even the node's own card switches it on: the operator's flag does.
    with pytest.raises(RunRefused):
        card_to_run(asks, own=True, roots=(tmp_path,), remote_code=())
    assert card_to_run(asks, own=False, roots=(tmp_path,), remote_code=["qwen"]).trust_remote_code
    assert not card_to_run(HUB, own=False, roots=(tmp_path,), remote_code=()).trust_remote_code


def test_a_cluster_cards_local_source_resolves_inside_the_models_directories(
    tmp_path: Path,
) -> None:
    models, extra, outside = tmp_path / "models", tmp_path / "extra", tmp_path / "outside"
    for d in (models / "mine", extra / "theirs", outside):
        d.mkdir(parents=True)
    (models / "escape").symlink_to(outside)
    roots = (models, extra)

    def run(source: str, own: bool = False) -> str:
        card = msgspec.structs.replace(HUB, source=source)
        return card_to_run(card, own=own, roots=roots, remote_code=()).source

    assert run("local:mine") == f"local:{models / 'mine'}"
    assert run("local:theirs") == f"local:{extra / 'theirs'}"
    assert run(f"local:{models / 'mine'}") == f"local:{models / 'mine'}"
    for bad in ("local:/etc", f"local:{outside}", "local:../outside", "local:escape", "local:"):
        with pytest.raises(RunRefused):
            run(bad)
    # The node's own card (its operator's plugin wrote it) may name any directory.
    assert run(f"local:{outside}", own=True) == f"local:{outside}"


# -- resources --------------------------------------------------------------------------------


def test_claimed_resources_must_be_plausible() -> None:
    honest = NodeResources(memory_total=16 * GIB, memory_available=8 * GIB)
    assert resources_refusal(None, honest) is None
    assert resources_refusal(honest, honest) is None
    # What the attacker sent: 1 PiB on its first report.
    magnet = NodeResources(memory_total=1 << 50, memory_available=1 << 50)
    assert resources_refusal(None, magnet) is not None
    assert resources_refusal(None, NodeResources(memory_total=MAX_PLAUSIBLE_MEMORY)) is None
    more_than_total = NodeResources(memory_total=16 * GIB, memory_available=17 * GIB)
    assert "exceeds" in (resources_refusal(None, more_than_total) or "")
    jump = NodeResources(memory_total=64 * GIB, memory_available=60 * GIB)
    assert "jumped" in (resources_refusal(honest, jump) or "")
    drift = NodeResources(memory_total=16 * GIB + GIB // 2, memory_available=GIB)
    assert resources_refusal(honest, drift) is None
    assert resources_refusal(None, NodeResources(disk_total=1, disk_available=2)) is not None
    assert resources_refusal(None, NodeResources(cpu_count=-1)) is not None


# -- placement --------------------------------------------------------------------------------


def test_placement_can_be_pinned_and_nodes_excluded() -> None:
    state = State(nodes={NodeId(n): node(n, m) for n, m in [("a", 16 * GIB), ("liar", 64 * GIB)]})
    c = ctx(HUB)

    def placed_on(command: PlaceInstance, c: MasterContext = c) -> set[str]:
        created = decide(state, command, c).events[-1]
        assert isinstance(created, InstanceCreated)
        return {s.node_id for s in created.instance.shards}

    assert placed_on(PlaceInstance(model_id=HUB.model_id)) == {"liar"}  # the most memory
    assert placed_on(PlaceInstance(model_id=HUB.model_id, nodes=(NodeId("a"),))) == {"a"}
    assert placed_on(PlaceInstance(model_id=HUB.model_id, exclude_nodes=(NodeId("liar"),))) == {"a"}
    operator = MasterContext(card=c.card, place=place, exclude_nodes=(NodeId("liar"),))
    assert placed_on(PlaceInstance(model_id=HUB.model_id), operator) == {"a"}
    with pytest.raises(CommandRefused) as refused:
        decide(state, PlaceInstance(model_id=HUB.model_id, nodes=(NodeId("gone"),)), c)
    assert refused.value.status == 409
    assert placement_view(state) is state


def test_a_re_placement_keeps_the_pin() -> None:
    names = ["a", "b", "liar"]
    state = State(nodes={NodeId(n): node(n, (i + 1) * 16 * GIB) for i, n in enumerate(names)})
    command = PlaceInstance(model_id=HUB.model_id, nodes=(NodeId("a"), NodeId("b")))
    (created,) = decide(state, command, ctx(HUB)).events
    assert isinstance(created, InstanceCreated)
    (lost,) = {s.node_id for s in created.instance.shards}
    state = msgspec.structs.replace(
        state, instances={created.instance.instance_id: created.instance}
    )
    again = decide_node_timeout(state, lost, ctx(HUB))[-1]
    assert isinstance(again, InstanceCreated)
    assert {s.node_id for s in again.instance.shards} == {"a", "b"} - {lost}
    assert again.instance.nodes == command.nodes


# -- deleting models in use -------------------------------------------------------------------


def test_a_model_is_in_use_under_every_name_that_reaches_its_folder() -> None:
    folder = "/data/models/SmolLM2-135M-Instruct-Q4_1-mlx"
    state = on("n", BUILTIN, runner_path=folder)
    card = ctx(HUB).card
    for name in ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-Q4_1-mlx"):
        assert instances_using(state, NodeId("n"), name, card) == ["inst"], name
    assert instances_using(state, NodeId("other"), "SmolLM2-135M-Instruct-Q4_1-mlx", card) == []
    assert instances_using(state, NodeId("n"), "something-else", card) == []
    # A hub model: by id, by repo id, by its folder (`org--name`), and by a reported download.
    hub = on("n", HUB)
    for name in ("qwen", "Org/Qwen-Tiny", "Org--Qwen-Tiny"):
        assert instances_using(hub, NodeId("n"), name, card) == ["inst"], name
    download = DownloadProgress(
        node_id=NodeId("n"), model_id=HUB.model_id, status=DownloadStatus.COMPLETED,
        path="/elsewhere/qwen-copy",
    )  # fmt: skip
    hub = msgspec.structs.replace(hub, downloads={NodeId("n"): {HUB.model_id: download}})
    assert instances_using(hub, NodeId("n"), "qwen-copy", card) == ["inst"]


def test_the_master_refuses_to_delete_a_model_in_use_by_its_folder_name() -> None:
    state = on("n", BUILTIN, runner_path="/m/SmolLM2-135M-Instruct-Q4_1-mlx")
    command = DeleteDownload(
        node_id=NodeId("n"), model_id=ModelId("SmolLM2-135M-Instruct-Q4_1-mlx")
    )
    with pytest.raises(CommandRefused) as refused:
        decide(state, command, ctx())
    assert refused.value.status == 409 and "inst" in refused.value.message
