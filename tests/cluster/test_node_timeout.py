"""A node unseen for the timeout leaves state; its instances are re-placed where they fit."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from exo_core import campaign as campaign_module
from exo_core.decide import MasterContext, decide_node_timeout
from exo_core.events import (
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeTelemetry,
    NodeTimedOut,
)
from exo_core.ids import InstanceId, NodeId
from exo_core.placement import place
from exo_core.reducer import replay
from exo_core.state import NodeResources
from exo_core.testing.harness import running_cluster
from exo_core.testing.scripted_engine import ECHO, ScriptedEnginePlugin


def telemetry(node: str, free: int) -> NodeTelemetry:
    resources = NodeResources(memory_total=free, memory_available=free, engines=("scripted",))
    return NodeTelemetry(node_id=NodeId(node), hostname=node, resources=resources, timestamp=1.0)


def test_timeout_deletes_and_re_places_when_it_fits() -> None:
    from exo_core.decide import build_instance
    from exo_core.placement_types import PlacementRequest

    base = replay(
        [
            IndexedEvent(index=i, term=1, event=e)
            for i, e in enumerate([telemetry("a", 10**9), telemetry("b", 10**9)])
        ]
    )
    option = next(
        o
        for o in place(ECHO, PlacementRequest(model_id=ECHO.model_id, sharding="pipeline"), base)
        if o.node_ids == ("b",)
    )
    instance = build_instance(base, option, InstanceId("i1"))
    state = replay([IndexedEvent(index=2, term=1, event=InstanceCreated(instance=instance))], base)
    ctx = MasterContext(card=lambda m: ECHO if m == ECHO.model_id else None, place=place)
    events = decide_node_timeout(state, NodeId("b"), ctx)
    kinds = [type(e) for e in events]
    assert kinds == [InstanceDeleted, NodeTimedOut, InstanceCreated]
    new = events[2]
    assert isinstance(new, InstanceCreated)
    assert [s.node_id for s in new.instance.shards] == ["a"]


def test_timeout_without_room_only_deletes() -> None:
    base = replay([IndexedEvent(index=0, term=1, event=telemetry("b", 10**9))])
    from exo_core.decide import build_instance
    from exo_core.placement_types import PlacementRequest

    option = place(ECHO, PlacementRequest(model_id=ECHO.model_id, sharding="pipeline"), base)[0]
    state = replay(
        [
            IndexedEvent(index=1, term=1, event=telemetry("a", 10)),  # too little memory
            IndexedEvent(
                index=2,
                term=1,
                event=InstanceCreated(instance=build_instance(base, option, InstanceId("i1"))),
            ),
        ],
        base,
    )
    ctx = MasterContext(card=lambda m: ECHO, place=place)
    kinds = [type(e) for e in decide_node_timeout(state, NodeId("b"), ctx)]
    assert kinds == [InstanceDeleted, NodeTimedOut]


def test_a_silent_node_is_timed_out_and_its_instance_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(campaign_module, "NODE_TIMEOUT_S", 2.0)
    with running_cluster(tmp_path, 3, lambda i: [ScriptedEnginePlugin()]) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        (master,) = cluster.masters()
        created = httpx.post(f"{master.url}/instance", json={"model_id": "scripted-echo"}).json()
        cluster.wait(cluster.converged)
        instance = master.node.state.instances[created["instance_id"]]
        holder_id = instance.shards[0].node_id
        holder = next(n for n in cluster.nodes if n.node_id == holder_id)
        # Whether or not it was the master: a (new) master times it out all the same.
        cluster.stop(holder)

        def timed_out() -> bool:
            masters = cluster.masters()
            return len(masters) == 1 and holder_id not in masters[0].node.state.nodes

        cluster.wait(timed_out, timeout=15)
        state = cluster.masters()[0].node.state
        assert created["instance_id"] not in state.instances
        (moved,) = state.instances.values()
        assert moved.model_id == "scripted-echo" and moved.shards[0].node_id != holder_id
