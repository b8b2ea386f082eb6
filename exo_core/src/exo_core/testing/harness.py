"""Run real nodes for tests: each in its own thread with its own event loop, API on a real port.

with running_node(tmp_path, plugins=[ScriptedEnginePlugin()]) as node:
    httpx.get(f"{node.url}/state")
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

from exo_core.config import NodeConfig
from exo_core.election import ElectionTiming
from exo_core.node import Node
from exo_core.plugin_host import ENTRY_POINT_GROUP, PluginHost, load_plugins
from exo_core.server import serve_api
from exo_core.transport.base import Transport
from exo_core.transport.memory import MemoryNetwork


def converged(alive: list[Node]) -> bool:
    """One master among the live nodes, and every live node holds the master's state."""
    masters = [n for n in alive if n.master is not None]
    if len(masters) != 1:
        return False
    expected = masters[0].state
    return all(n.state == expected for n in alive)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningNode:
    node: Node
    url: str
    portal: BlockingPortal
    future: Future[Any] = field(repr=False)

    @property
    def node_id(self) -> str:
        return self.node.node_id

    def call(self, fn: Any, *args: Any) -> Any:
        """Run an async function on the node's event loop and return its result."""
        return self.portal.call(fn, *args)


@contextlib.contextmanager
def running_node(
    data_dir: Path,
    plugins: list[object] = (),  # type: ignore[assignment]
    *,
    entry_points: bool = False,
    dialects: bool = True,
    transport: Transport | None = None,
    election: ElectionTiming = ElectionTiming(heartbeat=0.1, timeout=1.0, settle=0.2),
    wait_ready: bool = True,
    **config: Any,
) -> Iterator[RunningNode]:
    """A node with its API, in a thread. Plugins are registered objects; every entry-point
    plugin is loaded only when `entry_points` is true, the installed API dialects (plugins
    that only add routes) unless `dialects` is false."""
    host = load_plugins(entry_points=entry_points)
    for plugin in plugins:
        host.register(plugin)
    if dialects and not entry_points:
        add_installed_dialects(host)
    port = config.pop("api_port", None) or free_port()
    # Tests stay on loopback: ring addresses come from the listen host.
    config.setdefault("listen_host", "127.0.0.1")
    cfg = NodeConfig(
        data_dir=str(data_dir), api_port=port, transport=config.pop("transport", "memory"), **config
    )
    with start_blocking_portal() as portal:
        node = portal.call(lambda: _make_node(cfg, host, transport, election))
        jobs = [lambda: serve_api(node)] if cfg.api else []
        future = portal.start_task_soon(lambda: node.run(extra=jobs))
        url = f"http://127.0.0.1:{port}"
        running = RunningNode(node=node, url=url, portal=portal, future=future)
        if wait_ready:
            _wait_ready(running, cfg.api)
        try:
            yield running
        finally:
            _stop(running)


@dataclass
class RunningCluster:
    """Several nodes on one event loop, joined by an in-memory network."""

    nodes: list[RunningNode]
    network: MemoryNetwork
    portal: BlockingPortal
    restart_node: Any = None

    def call(self, fn: Any, *args: Any) -> Any:
        return self.portal.call(fn, *args)

    def masters(self) -> list[RunningNode]:
        return [n for n in self.nodes if n.node.master is not None and not n.future.done()]

    def alive(self) -> list[RunningNode]:
        return [n for n in self.nodes if not n.future.done()]

    def stop(self, node: RunningNode) -> None:
        """Stop one node as a crash would: its tasks end and its transport leaves."""
        _stop(node)

    def restart(self, index: int) -> RunningNode:
        """Start node `index` again from its data directory (after `stop`)."""
        self.nodes[index] = self.restart_node(index)
        return self.nodes[index]

    def wait(self, predicate: Any, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not get there in time")
            time.sleep(0.05)

    def converged(self) -> bool:
        """Every live node holds the same log as the master, and there is one master."""
        return converged([n.node for n in self.alive()])


@contextlib.contextmanager
def running_cluster(
    root: Path,
    count: int,
    plugins: Any = lambda i: [],
    *,
    network: MemoryNetwork | None = None,
    election: ElectionTiming = ElectionTiming(heartbeat=0.1, timeout=1.0, settle=0.3),
    api: bool = True,
    dialects: bool = False,
    converge: bool = True,
    **config: Any,
) -> Iterator[RunningCluster]:
    """`count` nodes with APIs, on one event loop, over one in-memory network.

    `plugins(i)` gives the plugin objects of node i; the installed API dialects are added
    when `dialects` is true. With `converge` (the default) it returns once the nodes agree;
    without, at once (a network partitioned from the start never converges)."""
    network = network or MemoryNetwork()
    # Tests stay on loopback: ring addresses come from the listen host.
    config.setdefault("listen_host", "127.0.0.1")
    with start_blocking_portal() as portal:
        running: list[RunningNode] = []

        def start(i: int) -> RunningNode:
            host = load_plugins(entry_points=False)
            for plugin in plugins(i):
                host.register(plugin)
            if dialects:
                add_installed_dialects(host)
            port = free_port()
            cfg = NodeConfig(
                data_dir=str(root / f"node{i}"), api_port=port, api=api, transport="memory",
                **config,
            )  # fmt: skip
            transport = network.transport(f"node-{i}")
            node = portal.call(lambda: _make_node(cfg, host, transport, election))
            jobs = [lambda: serve_api(node)] if api else []
            future = portal.start_task_soon(lambda: node.run(extra=jobs))
            return RunningNode(node, f"http://127.0.0.1:{port}", portal, future)

        try:
            running.extend(start(i) for i in range(count))
            cluster = RunningCluster(running, network, portal, restart_node=start)
            if converge:
                cluster.wait(cluster.converged)
            if api:  # the APIs start beside the nodes: wait until each answers
                cluster.wait(lambda: all(_answers(n.url) for n in cluster.nodes))
            yield cluster
        finally:
            for n in running:
                n.future.cancel()
            for n in running:
                _stop(n)


def add_installed_dialects(host: PluginHost) -> None:
    """Register the installed plugins whose only hook is `exo_routes` (the API dialects), unless
    the same module is registered already."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = ep.load()
        except Exception:  # reported by `load_plugins` where it matters; not a dialect here
            continue
        hooks = {n for n in dir(module) if host.pm.parse_hookimpl_opts(module, n) is not None}
        if hooks == {"exo_routes"} and not host.pm.is_registered(module):
            host.register(module, name=ep.name)


def _stop(running: RunningNode, timeout: float = 10.0) -> None:
    """Cancel a node's run and wait until its shutdown has ended. The future reads cancelled
    at once, before the run's own cleanup (transport, log, data directory lock) has run: a
    restart on the same data directory right after found the lock still held."""
    running.future.cancel()
    deadline = time.monotonic() + timeout
    while running.node.data_lock.held and time.monotonic() < deadline:
        time.sleep(0.01)


async def _make_node(
    cfg: NodeConfig, host: Any, transport: Transport | None, election: ElectionTiming
) -> Node:
    return Node(cfg, host, transport=transport, election_timing=election)


def _wait_ready(running: RunningNode, api: bool, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running.future.done():
            running.future.result()  # raises what stopped the node
        node = running.node
        master = node.state.master
        elected = master is not None and (master.node_id, master.term) == (
            node.election.master,
            node.election.term,
        )
        known = node.node_id in node.state.nodes  # its own telemetry is in state
        if elected and known and (not api or _answers(running.url)):
            return
        time.sleep(0.05)
    raise TimeoutError("the node did not become ready")


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def events_text(url: str) -> str:
    """Every event a node's `/events` serves, from index 0 up to its last one, as served."""
    last = httpx.get(f"{url}/healthz").json()["last_index"]
    lines: list[str] = []
    with httpx.stream("GET", f"{url}/events", params={"since": 0}, timeout=10) as r:
        for line in r.iter_lines():
            lines.append(line)
            if line.startswith("id:") and int(line[3:].strip()) >= last:
                break
    return "\n".join(lines)


__all__ = [
    "RunningCluster",
    "RunningNode",
    "converged",
    "events_text",
    "free_port",
    "running_cluster",
    "running_node",
]
