"""Simulated clusters: many nodes in one event loop, on one in-memory network with faults.

Run a simulation in virtual time (`run_simulation`) so it is fast and repeatable: the network's
faults come from the seed, and time only moves when every node is idle.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import anyio
import anyio.lowlevel
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup

from exo_core.config import NodeConfig
from exo_core.election import ElectionTiming
from exo_core.ids import ModelId, RunnerId
from exo_core.node import Node
from exo_core.plugin_host import load_plugins
from exo_core.state import NodeResources
from exo_core.telemetry import gather_resources
from exo_core.testing.harness import converged
from exo_core.testing.virtual_time import virtual_time_options
from exo_core.transport.memory import MemoryNetwork

T = TypeVar("T")


class SimulatedCrash(Exception):
    """A node crashed at a crash point: it ends there, leaving its files as they are."""


@dataclass
class SimNode:
    index: int
    node: Node
    scope: anyio.CancelScope
    stopped: anyio.Event = field(default_factory=anyio.Event)
    # Set when a crash point ended it: every later write of this incarnation fails.
    crashed: bool = False

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
            host.register(plugin)
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
            try:
                with sim.scope:
                    await node.run()
            except* SimulatedCrash:
                pass  # the crash point already ended the node (see CrashPoints)
            finally:
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


class CrashPoints:
    """Crashes nodes at random crash points inside durable writes: vote files (written,
    synced, renamed) and event log appends (before, with a frame half written, written).

    Install with `exo_core.durable.crash_hook(points)`. A crash cancels the node and raises
    `SimulatedCrash` from the write, so nothing after that point reaches the disk."""

    def __init__(
        self,
        cluster: SimCluster,
        rng: random.Random,
        probability: float,
        may_crash: Callable[[SimNode], bool] = lambda sim: True,
        on_crash: Callable[[SimNode, str], None] = lambda sim, point: None,
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.probability = probability
        self.may_crash = may_crash
        self.on_crash = on_crash
        self.crashes: list[tuple[int, str]] = []

    def _owner(self, path: Path) -> SimNode | None:
        for sim in self.cluster.nodes:
            # A node that has ended owns nothing: its data is its restarted twin's, which
            # loads it before it takes the old one's place in the list.
            if path.is_relative_to(sim.node.config.data_path) and not sim.stopped.is_set():
                return sim
        return None

    def __call__(self, point: str, path: Path) -> None:
        sim = self._owner(path)
        if sim is None or not sim.alive:
            # A stopped incarnation writes nothing more: this is its successor being built
            # (a restart reads its log, and may compact it, before it is registered).
            return
        if sim.crashed:
            raise SimulatedCrash(f"node {sim.index} is down")
        if self.rng.random() >= self.probability or not self.may_crash(sim):
            return
        sim.crashed = True
        self.crashes.append((sim.index, point))
        self.on_crash(sim, point)
        sim.scope.cancel()
        raise SimulatedCrash(f"node {sim.index} crashed at {point} of {path.name}")


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


async def _in_this_thread(func: Callable[..., T], *args: Any, **_options: Any) -> T:
    """`anyio.to_thread.run_sync` for virtual time: the call runs here, taking no virtual
    time. In a worker thread it would take real time, while the loop's clock jumps on to the
    next timer, so its answer would land at a virtual time (and in an order among the other
    nodes' timers) set by how busy the machine is: a seed would not replay the same run."""
    await anyio.lowlevel.checkpoint()
    return func(*args)


def run_simulation(body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` in virtual time, with every node reading the same fixed resources: the
    machine's real free memory and disk move with whatever else runs on it, and a move is
    news that telemetry commits, so a seed would not replay the same log. Calls that nodes
    hand to worker threads (the models dir's poll) run in the loop's thread instead."""
    fixed = gather_resources("/", ())

    def steady(
        disk_path: str,
        engines: tuple[str, ...],
        serves: tuple[ModelId, ...] | None = None,
        runner_pids: dict[RunnerId, int] | None = None,
    ) -> NodeResources:
        return msgspec.structs.replace(fixed, engines=engines, serves=serves, cpu_percent=0.0)

    with (
        mock.patch("exo_core.reporting.gather_resources", steady),
        mock.patch("anyio.to_thread.run_sync", _in_this_thread),
    ):
        return anyio.run(body, backend="asyncio", backend_options=virtual_time_options())


__all__ = [
    "CrashPoints",
    "SimCluster",
    "SimNode",
    "SimulatedCrash",
    "run_simulation",
    "sim_cluster",
]
