"""100 nodes in the deterministic simulation (virtual time, production election timing): a
new master within 3 s of the old one's death, whether its connections drop (kill -9: the
peers' transports report it) or it falls silent (a machine that lost power: only the
heartbeat timeout tells). bench/bench_sim_scale.py prints the other 100-node figures."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import anyio
import pytest

from exo_core.node import Node
from exo_core.testing.harness import converged
from exo_core.testing.simulation import SimCluster, SimNode, run_simulation, sim_cluster
from exo_core.transport.memory import MemoryNetwork

pytestmark = pytest.mark.slow

NODES = 100
BOUND_S = 3.0  # the bound for failover at 100 nodes, in virtual seconds


def term(node: Node) -> int:
    return node.state.master.term if node.state.master else -1


async def failover(cluster: SimCluster, survivors: list[SimNode], old_term: int) -> float:
    """Virtual seconds until every survivor's state names one master of a newer term."""
    started = anyio.current_time()
    nodes = [s.node for s in survivors]
    await cluster.wait(
        lambda: converged(nodes) and all(term(n) > old_term for n in nodes), timeout=60
    )
    return anyio.current_time() - started


def test_failover_among_100_nodes_within_3_virtual_seconds(tmp_path: Path) -> None:
    network = MemoryNetwork(seed=28)

    async def body() -> tuple[float, float]:
        async with sim_cluster(tmp_path, NODES, network) as cluster:
            await cluster.wait(
                lambda: (
                    cluster.converged()
                    and all(len(s.node.state.nodes) == NODES for s in cluster.nodes)
                ),
                timeout=120,
            )
            (master,) = cluster.masters()
            old = term(master.node)
            await cluster.kill(master)
            killed = await failover(cluster, cluster.alive(), old)

            (master,) = cluster.masters()
            old = term(master.node)
            network.silence(master.node.transport.node_id)
            survivors = [s for s in cluster.alive() if s is not master]
            silenced = await failover(cluster, survivors, old)
            return killed, silenced

    # 100 nodes share this machine's one disk: their fsyncs of every broadcast would take most
    # of the run, and durability is not what this test is about (test_simulation.py's is).
    with mock.patch("os.fsync", lambda fd: None):
        killed, silenced = run_simulation(body)
    print(f"failover among {NODES} nodes: {killed:.2f}s after a kill, {silenced:.2f}s silent")
    assert killed < BOUND_S
    assert silenced < BOUND_S
