"""Deterministic simulations: five nodes on the in-memory transport, in virtual time.

Broadcasts are lost, duplicated and reordered; the network is partitioned and healed; masters
and other nodes are killed at random points and restarted from their data directories, while
clients send commands to random nodes. After healing, every node must hold the master's log,
and every command that was acknowledged must be in it.

Everything random comes from the seed and time is virtual (it jumps to the next timer when all
nodes are idle), so a failing seed replays the same run: `pytest -k "seed_17"`.
"""

from __future__ import annotations

import random
from pathlib import Path
from unittest import mock

import anyio
import pytest

from exo_core.commands import AddModelCard
from exo_core.durable import crash_hook
from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard
from exo_core.testing.simulation import CrashPoints, SimCluster, run_simulation, sim_cluster
from exo_core.transport.memory import Faults, MemoryNetwork
from exo_core.votes import VoteBook
from exo_core.wire import Vote, VoteRequest

NODES = 5
SEEDS = [pytest.param(seed, id=f"seed_{seed}") for seed in range(40)]
CRASH_SEEDS = [pytest.param(seed, id=f"crash_seed_{seed}") for seed in range(200)]


def card(name: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(name), family="llama", n_layers=1, hidden_size=8, storage_size_bytes=1
    )


async def clients(cluster: SimCluster, rng: random.Random, acknowledged: list[str]) -> None:
    """Send commands to random live nodes, forever; remember what was acknowledged."""
    sent = 0

    async def one(name: str) -> None:
        alive = cluster.alive()
        if not alive:
            return
        node = rng.choice(alive)
        try:
            result = await node.node.send_command(AddModelCard(card=card(name)), timeout=5)
        except Exception:  # no master answered in time, or the node died under us
            return
        if result.ok:
            acknowledged.append(name)

    async with anyio.create_task_group() as tg:
        while True:
            tg.start_soon(one, f"card-{sent}")
            sent += 1
            await anyio.sleep(rng.uniform(0.05, 0.3))


class Votes:
    """Every vote a node granted (answered as granted), to check none is forgotten."""

    def __init__(self) -> None:
        self.granted: dict[Path, list[tuple[int, str]]] = {}

    def record(self, book: VoteBook, vote: Vote, request: VoteRequest) -> None:
        if vote.granted:
            self.granted.setdefault(book.path, []).append((request.term, request.candidate))

    def check(self, path: Path) -> None:
        """The vote on disk is the last one granted: a restarted node never votes twice in a
        term (which could give one term two masters)."""
        on_disk = VoteBook(path)
        for term, candidate in self.granted.get(path, []):
            where = f"{path}: granted {candidate} in term {term}, but the disk says "
            where += f"{on_disk.voted_for} in term {on_disk.term}"
            if on_disk.term == term:
                assert on_disk.voted_for == candidate, where
            else:
                assert on_disk.term > term, where


async def chaos(
    cluster: SimCluster, rng: random.Random, steps: int, dead: set[int], votes: Votes
) -> None:
    async def restart(index: int) -> None:
        dead.discard(index)
        votes.check(cluster.root / f"node{index}" / "vote.json")
        await cluster.start(index)

    for _ in range(steps):
        action = rng.choice(["partition", "heal", "kill_master", "kill_any", "restart"])
        if action == "partition":
            ids = [f"node-{i}" for i in range(len(cluster.nodes))]
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            cluster.network.partition(set(ids[:cut]), set(ids[cut:]))
        elif action == "heal":
            cluster.network.heal()
        elif action in ("kill_master", "kill_any") and len(dead) < max_dead(cluster):
            victims = cluster.masters() if action == "kill_master" else cluster.alive()
            if victims:
                victim = rng.choice(victims)
                dead.add(victim.index)
                await cluster.kill(victim)
        elif action == "restart" and dead:
            await restart(rng.choice(sorted(dead)))
        await anyio.sleep(rng.uniform(0.2, 3.0))
    cluster.network.heal()
    for index in sorted(dead):
        await cluster.kill(cluster.nodes[index])  # a node crashed at a crash point has ended
        await restart(index)


def max_dead(cluster: SimCluster) -> int:
    """As many nodes as may be down with a majority still up."""
    return (len(cluster.nodes) - 1) // 2


def simulate(
    root: Path,
    seed: int,
    nodes: int = NODES,
    steps: int = 12,
    crash_rate: float = 0.002,
    snapshot_every: int = 10_000,
) -> list[tuple[int, int, str]]:
    """Run one seeded simulation; returns the final log as (index, term, event kind).

    `crash_rate` is the chance that a node crashes at each crash point it passes (inside
    every vote write and event log append); `snapshot_every` how often nodes cut their log
    behind a snapshot."""
    rng = random.Random(seed)
    network = MemoryNetwork(
        seed=seed, faults=Faults(loss=0.15, duplication=0.1, reorder=0.2, max_delay=0.2)
    )
    acknowledged: list[str] = []
    votes = Votes()
    dead: set[int] = set()
    decide = VoteBook.decide

    def recording(book: VoteBook, request: VoteRequest, last_term: int, last_index: int) -> Vote:
        vote = decide(book, request, last_term, last_index)
        votes.record(book, vote, request)
        return vote

    async def body() -> list[tuple[int, int, str]]:
        async with sim_cluster(root, nodes, network, snapshot_every=snapshot_every) as cluster:
            await cluster.wait(lambda: all(len(n.node.state.nodes) == nodes for n in cluster.nodes))
            points = CrashPoints(
                cluster,
                random.Random(seed + 2000),
                crash_rate,
                may_crash=lambda sim: sim.index not in dead and len(dead) < max_dead(cluster),
                on_crash=lambda sim, point: dead.add(sim.index),
            )
            with crash_hook(points):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(clients, cluster, random.Random(seed + 1000), acknowledged)
                    await chaos(cluster, rng, steps, dead, votes)
                    # Healed, with every node back: the cluster must make progress again.
                    points.probability = 0.0
                    before = len(acknowledged)
                    try:
                        await cluster.wait(lambda: len(acknowledged) >= before + 3, timeout=60)
                    except TimeoutError:
                        raise AssertionError(f"no progress; crashes: {points.crashes}") from None
                    tg.cancel_scope.cancel()
            await cluster.wait(cluster.converged, timeout=60)
            for n in cluster.nodes:
                votes.check(n.node.votes.path)
            states = [n.node.state for n in cluster.nodes]
            assert all(s == states[0] for s in states)
            logs = [list(n.node.replica.log) for n in cluster.nodes]
            # Each node cuts its log behind its own snapshots: compare what they all kept.
            first = max(n.node.replica.first_index for n in cluster.nodes)
            assert snapshot_every > len(logs[0]) or first > 0, "no node cut its log"
            logs = [[e for e in log if e.index >= first] for log in logs]
            assert all(log == logs[0] for log in logs), "every node holds the same log"
            held = set(states[0].model_cards)
            missing = [name for name in acknowledged if name not in held]
            assert not missing, f"acknowledged but lost: {missing}"
            return [(e.index, e.term, type(e.event).__name__) for e in logs[0]]

    with mock.patch.object(VoteBook, "decide", recording):
        return run_simulation(body)


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_faults_never_lose_an_acknowledged_command(tmp_path: Path, seed: int) -> None:
    simulate(tmp_path, seed)


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_seeded_faults_with_snapshots_every_few_events(tmp_path: Path, seed: int) -> None:
    """Logs cut behind snapshots at different points on each node, nodes that catch up over
    a snapshot: still no acknowledged command is lost."""
    simulate(tmp_path, seed, snapshot_every=7)


@pytest.mark.parametrize("seed", CRASH_SEEDS)
def test_crashes_inside_vote_and_log_writes_lose_nothing(tmp_path: Path, seed: int) -> None:
    """Three nodes, crashing often at the crash points inside durable writes."""
    simulate(tmp_path, seed, nodes=3, steps=5, crash_rate=0.02)


def test_a_seed_replays_the_same_run(tmp_path: Path) -> None:
    first = simulate(tmp_path / "a", 7)
    second = simulate(tmp_path / "b", 7)
    assert first == second
