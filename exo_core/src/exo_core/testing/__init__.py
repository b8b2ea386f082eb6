"""Test helpers for the core and for plugins: real nodes, real processes, a scripted engine.

    from exo_core.testing import running_node, ScriptedEnginePlugin

    with running_node(tmp_path, plugins=[MyPlugin()]) as node:
        httpx.get(f"{node.url}/state")

A real network on one machine (root): hosts in their own network namespaces on an emulated
switch with per-link delay, jitter, loss, reordering and rate, links cut and healed at will,
and exo nodes that find each other by mDNS alone (docs/testing-network.md):

    with emulated_network(3, LinkSpec(delay_ms=1)) as net, exo_on_network(net, tmp_path) as nodes:
        net.partition([0], [1, 2])

The transport conformance suite is star-imported from `exo_core.testing.transport_conformance`
(it holds pytest tests).
"""

from exo_core.cli import main as exo_main
from exo_core.testing.harness import (
    RunningCluster,
    RunningNode,
    converged,
    free_port,
    running_cluster,
    running_node,
)
from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import (
    EmulatedNetwork,
    emulated_network,
    exo_on_network,
    network_problem,
)
from exo_core.testing.processes import ExoProcess, exo_processes
from exo_core.testing.scripted_engine import ECHO, THINKER, ScriptedEngine, ScriptedEnginePlugin
from exo_core.testing.waiting import wait_until, wait_until_async

__all__ = [
    "ECHO",
    "THINKER",
    "EmulatedNetwork",
    "ExoProcess",
    "LinkSpec",
    "RunningCluster",
    "RunningNode",
    "ScriptedEngine",
    "ScriptedEnginePlugin",
    "converged",
    "emulated_network",
    "exo_main",
    "exo_on_network",
    "exo_processes",
    "free_port",
    "network_problem",
    "running_cluster",
    "running_node",
    "wait_until",
    "wait_until_async",
]
