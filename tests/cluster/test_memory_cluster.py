"""Several nodes on the in-memory transport: election, replication, failover, partitions."""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path

import httpx
import pytest

from exo_core.commands import AddModelCard
from exo_core.generation import ChatMessage, GenerationParams, TextChunk
from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard
from exo_core.node import NotCommitted
from exo_core.testing.harness import RunningCluster, RunningNode, running_cluster
from exo_core.testing.scripted_engine import ScriptedEnginePlugin
from exo_core.transport.memory import MemoryNetwork


def scripted(i: int) -> list[object]:
    return [ScriptedEnginePlugin()]


def card(name: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(name), family="llama", n_layers=1, hidden_size=8, storage_size_bytes=1
    )


async def _echo(node: RunningNode, text: str) -> str:
    params = GenerationParams(messages=(ChatMessage(role="user", content=text),))
    stream = await node.node.generation.generate("scripted-echo", params)
    async with aclosing(stream) as chunks:
        return "".join([c.text async for c in chunks if isinstance(c, TextChunk)])


def test_three_nodes_elect_one_master_and_share_state(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, scripted) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        cluster.wait(cluster.converged)
        (master,) = cluster.masters()
        for n in cluster.nodes:
            state = httpx.get(f"{n.url}/state").json()
            assert state["master"]["node_id"] == master.node_id
        # A command sent to a follower is forwarded to the master.
        follower = next(n for n in cluster.nodes if n is not master)
        created = httpx.post(f"{follower.url}/instance", json={"model_id": "scripted-echo"})
        assert created.status_code == 201, created.text
        cluster.wait(cluster.converged)
        assert all(len(n.node.state.instances) == 1 for n in cluster.nodes)


def test_master_failover_keeps_instances_and_serving(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, scripted) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        (master,) = cluster.masters()
        survivor = next(n for n in cluster.nodes if n is not master)
        # Place an instance on a surviving node: ask that node, whose worker serves it.
        created = httpx.post(f"{survivor.url}/instance", json={"model_id": "scripted-echo"})
        instance_id = created.json()["instance_id"]
        cluster.wait(cluster.converged)
        holder = next(
            n
            for n in cluster.nodes
            if n.node.state.instances[instance_id].shard_on(n.node.node_id)  # type: ignore[arg-type]
        )
        if holder is master:  # placement chose the master's node: fail over the other way
            return
        old_term = master.node.state.master.term  # type: ignore[union-attr]
        started = time.monotonic()
        cluster.stop(master)
        cluster.wait(lambda: len(cluster.masters()) == 1, timeout=5)
        print(f"new master after {time.monotonic() - started:.2f}s")
        # The new master records its term in the log after it takes over: the nodes can agree
        # on the state that still names the old one for a moment first.
        cluster.wait(lambda: cluster.converged() and _master_term(cluster) > old_term)
        state = cluster.masters()[0].node.state
        assert state.master is not None and state.master.term > old_term
        assert instance_id in state.instances, "failover must not lose instances"
        assert holder.call(_echo, holder, "still here") == "echo: still here"


def _master_term(cluster: RunningCluster) -> int:
    """The term the master's own state records for its master (-1: none, or no master)."""
    masters = cluster.masters()
    master = masters[0].node.state.master if masters else None
    return master.term if master is not None else -1


def test_a_minority_commits_nothing_and_the_majority_goes_on(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 5, scripted) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 5 for n in cluster.nodes))
        (master,) = cluster.masters()
        others = [n for n in cluster.nodes if n is not master]
        minority = {master.node_id, others[0].node_id}
        majority = {n.node_id for n in others[1:]}
        cluster.network.partition(minority, majority)
        # The old master can no longer reach a majority: its commands are not acknowledged.
        lost = master.call(master.node.send_command, AddModelCard(card=card("minority-card")))
        assert lost.status == 503
        # A follower on the minority side says why it cannot commit (not a 30 s timeout).
        cut_off = others[0]
        with pytest.raises(NotCommitted, match="reaches 2 of the cluster's 5 members"):
            cut_off.call(cut_off.node.send_command, AddModelCard(card=card("cut-off-card")))
        cluster.wait(lambda: any(n.node.master is not None for n in others[1:]), timeout=10)
        new_master = next(n for n in others[1:] if n.node.master is not None)
        done = new_master.call(
            new_master.node.send_command, AddModelCard(card=card("majority-card"))
        )
        assert done.ok
        cluster.network.heal()
        cluster.wait(cluster.converged, timeout=20)
        for n in cluster.nodes:
            cards = n.node.state.model_cards
            assert "majority-card" in cards and "minority-card" not in cards
            assert "cut-off-card" not in cards


def test_a_late_joiner_catches_up(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, scripted) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        late = cluster.nodes[2]
        if late.node.master is not None:
            late = cluster.nodes[1]
        cluster.stop(late)
        (master,) = cluster.masters()
        for i in range(200):
            result = master.call(master.node.send_command, AddModelCard(card=card(f"m{i}")))
            assert result.ok
        index = cluster.nodes.index(late)
        rejoined = cluster.restart(index)
        cluster.wait(cluster.converged, timeout=20)
        assert len(rejoined.node.state.model_cards) == 200


def wait_master(cluster: RunningCluster) -> RunningNode:
    cluster.wait(lambda: len(cluster.masters()) == 1)
    return cluster.masters()[0]


@pytest.mark.parametrize(
    "groups",
    [
        [{"node-0"}, {"node-1"}, {"node-2"}],
        # Terms follow the node id: node-2 alone leads a later term than the pair's master, so
        # the pair's master must step down for it (a vote after its term), then win again.
        [{"node-0", "node-1"}, {"node-2"}],
        [{"node-0"}, {"node-1", "node-2"}],
    ],
    ids=["three-of-one", "pair-and-later-one", "one-and-later-pair"],
)
def test_clusters_that_formed_apart_merge_when_they_meet(
    tmp_path: Path, groups: list[set[str]]
) -> None:
    """Nodes that could not see each other at first form clusters apart; once they meet, one
    cluster remains (a node that merely missed its peers at start-up, or two sets of machines
    that ran apart, must not stay split)."""
    network = MemoryNetwork()
    network.partition(*groups)
    with running_cluster(tmp_path, 3, scripted, network=network, converge=False) as cluster:
        # One master a group, each node a member of its own group's cluster.
        cluster.wait(lambda: len(cluster.masters()) == len(groups))
        cluster.wait(lambda: all(n.node_id in n.node.state.nodes for n in cluster.nodes))
        network.heal()
        cluster.wait(lambda: len(cluster.masters()) == 1, timeout=30)
        cluster.wait(cluster.converged, timeout=30)
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes), timeout=30)
