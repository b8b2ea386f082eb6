"""Simulated clusters: many nodes in one event loop, on one in-memory network with faults.

Run a simulation in virtual time (`run_simulation`) so it is fast and repeatable: the network's
faults come from the seed, and time only moves when every node is idle.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

from exo_core.config import NodeConfig
from exo_core.election import ElectionTiming
from exo_core.node import Node
from exo_core.plugin_host import load_plugins
from exo_core.testing.harness import converged
from exo_core.testing.virtual_time import virtual_time_options
from exo_core.transport.memory import MemoryNetwork

T = TypeVar("T")


@dataclass
class SimNode:
    index: int
    node: Node
    scope: anyio.CancelScope
    stopped: anyio.Event = field(default_factory=anyio.Event)

    @property
    def alive(self) -> bool:
        return not self.stopped.is_set()


class SimCluster:
    def __init__(
        self,
        root: Path,
        network: MemoryNetwork,
        tg: TaskGroup,
        plugins: Callable[[int], list[object]],
        timing: ElectionTiming,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self._config = config or {}
        self.network = network
        self._tg = tg
        self._plugins = plugins
        self._timing = timing
        self.nodes: list[SimNode] = []

    async def start(self, index: int) -> SimNode:
        host = load_plugins(entry_points=False)
        for plugin in self._plugins(index):
            host.pm.register(plugin)
        config = NodeConfig(
            data_dir=str(self.root / f"node{index}"),
            api=False,
            transport="memory",
            listen_host="127.0.0.1",
            **self._config,
        )
        node = Node(
            config,
            host,
            transport=self.network.transport(f"node-{index}"),
            election_timing=self._timing,
        )
        sim = SimNode(index, node, anyio.CancelScope())

        async def run() -> None:
            with sim.scope:
                await node.run()
            sim.stopped.set()

        self._tg.start_soon(run)
        if index < len(self.nodes):
            self.nodes[index] = sim
        else:
            self.nodes.append(sim)
        return sim

    async def kill(self, sim: SimNode) -> None:
        """End a node as a crash would (its log stays on disk)."""
        sim.scope.cancel()
        await sim.stopped.wait()

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes if n.alive]

    def masters(self) -> list[SimNode]:
        return [n for n in self.alive() if n.node.master is not None]

    def converged(self) -> bool:
        return converged([n.node for n in self.alive()])

    async def wait(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def sim_cluster(
    root: Path,
    count: int,
    network: MemoryNetwork,
    plugins: Callable[[int], list[object]] = lambda i: [],
    timing: ElectionTiming = ElectionTiming(heartbeat=0.5, timeout=2.0, settle=1.0),
    **config: Any,
) -> AsyncIterator[SimCluster]:
    """`count` nodes; `config` holds `NodeConfig` fields for every node."""
    async with anyio.create_task_group() as tg:
        cluster = SimCluster(root, network, tg, plugins, timing, config)
        for i in range(count):
            await cluster.start(i)
        try:
            yield cluster
        finally:
            tg.cancel_scope.cancel()


def run_simulation(body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` in virtual time."""
    return anyio.run(body, backend="asyncio", backend_options=virtual_time_options())


__all__ = ["SimCluster", "SimNode", "run_simulation", "sim_cluster"]
