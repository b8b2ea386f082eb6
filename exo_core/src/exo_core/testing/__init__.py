"""Test helpers for the core and for plugins: real nodes, real processes, a scripted engine.

    from exo_core.testing import running_node, ScriptedEnginePlugin

    with running_node(tmp_path, plugins=[MyPlugin()]) as node:
        httpx.get(f"{node.url}/state")

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
    wait_until,
)
from exo_core.testing.processes import ExoProcess, exo_processes
from exo_core.testing.scripted_engine import ECHO, THINKER, ScriptedEngine, ScriptedEnginePlugin

__all__ = [
    "ECHO",
    "THINKER",
    "ExoProcess",
    "RunningCluster",
    "RunningNode",
    "ScriptedEngine",
    "ScriptedEnginePlugin",
    "converged",
    "exo_main",
    "exo_processes",
    "free_port",
    "running_cluster",
    "running_node",
    "wait_until",
]
