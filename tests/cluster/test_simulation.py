"""Seeded simulations: five nodes on the in-memory transport with faults injected.

Broadcasts are lost, duplicated and reordered; the network is partitioned and healed; masters
are killed at random points and nodes restarted from their data directories. Meanwhile
commands arrive at random nodes. After healing, every node must hold the master's log, and
every command that was acknowledged must be in it. Faults come from the seed, so a failing
seed points at a schedule to replay (thread timing still varies from run to run).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from exo_core.commands import AddModelCard
from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard
from exo_core.testing.harness import RunningCluster, running_cluster
from exo_core.transport.memory import Faults, MemoryNetwork

NODES = 5
SEEDS = range(6)


def card(name: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(name), family="llama", n_layers=1, hidden_size=8, storage_size_bytes=1
    )


class Clients:
    """Sends commands to random live nodes from a thread; remembers what was acknowledged."""

    def __init__(self, cluster: RunningCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.acknowledged: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Clients:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = self.cluster.alive()
            if not alive:
                time.sleep(0.05)
                continue
            node = self.rng.choice(alive)
            name = f"card-{self.sent}"
            self.sent += 1
            try:
                result = node.call(node.node.send_command, AddModelCard(card=card(name)), 5.0)
            except BaseException:  # the node was killed, or no master answered in time
                continue
            if result.ok:
                self.acknowledged.append(name)


def chaos(cluster: RunningCluster, rng: random.Random, steps: int) -> None:
    dead: set[int] = set()
    for _ in range(steps):
        action = rng.choice(["partition", "heal", "kill_master", "restart", "kill_any"])
        if action == "partition":
            ids = [n.node_id for n in cluster.nodes]
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            cluster.network.partition(set(ids[:cut]), set(ids[cut:]))
        elif action == "heal":
            cluster.network.heal()
        elif action in ("kill_master", "kill_any") and len(dead) < 2:
            victims = cluster.masters() if action == "kill_master" else cluster.alive()
            if victims:
                victim = rng.choice(victims)
                dead.add(cluster.nodes.index(victim))
                cluster.stop(victim)
        elif action == "restart" and dead:
            index = rng.choice(sorted(dead))
            dead.discard(index)
            cluster.restart(index)
        time.sleep(rng.uniform(0.1, 0.8))
    cluster.network.heal()
    for index in sorted(dead):
        cluster.restart(index)


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_faults_never_lose_an_acknowledged_command(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    network = MemoryNetwork(
        seed=seed, faults=Faults(loss=0.15, duplication=0.1, reorder=0.2, max_delay=0.05)
    )
    with running_cluster(tmp_path, NODES, network=network, api=False) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == NODES for n in cluster.nodes))
        with Clients(cluster, random.Random(seed + 1000)) as clients:
            chaos(cluster, rng, steps=10)
            # Healed: the cluster must make progress again.
            before = len(clients.acknowledged)
            cluster.wait(lambda: len(clients.acknowledged) >= before + 3, timeout=30)
        cluster.wait(cluster.converged, timeout=30)
        states = [n.node.state for n in cluster.nodes]
        assert all(s == states[0] for s in states)
        logs = [list(n.node.replica.log) for n in cluster.nodes]
        assert all(log == logs[0] for log in logs), "every node holds the same log"
        held = set(states[0].model_cards)
        missing = [name for name in clients.acknowledged if name not in held]
        assert not missing, f"acknowledged but lost: {missing}"
