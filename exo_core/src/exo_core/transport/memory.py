"""An in-memory transport: every node of a `MemoryNetwork` lives in this process.

It serves a single node (a network of one) and tests. Faults can be injected per network:
message loss, duplication, reordering (a random delay) and partitions, all drawn from one seeded
`random.Random`, so a simulation can be replayed from its seed. A node's `network_key` models
the private network of a real transport: nodes with different keys never reach each other.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from exo_core.transport.base import (
    PeerConnected,
    PeerDisconnected,
    RequestFailed,
    RequestHandler,
    Transport,
    TransportEvent,
    TransportLagged,
    TransportMessage,
)


@dataclass
class Faults:
    """Probabilities applied to each broadcast delivery; requests see partitions, and
    `request_loss`: a request lost on its way (never handled) or its answer lost on the way
    back (handled: a vote granted whose grant never arrives), each half the time, and the
    asker waits out its timeout."""

    loss: float = 0.0
    duplication: float = 0.0
    reorder: float = 0.0
    max_delay: float = 0.05
    request_loss: float = 0.0


@dataclass
class MemoryNetwork:
    """A set of in-process nodes that can all reach each other unless partitioned."""

    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    inbox_limit: int = 10_000
    _nodes: dict[str, MemoryTransport] = field(default_factory=dict)
    _cut: set[frozenset[str]] = field(default_factory=set)
    _silent: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def transport(self, node_id: str, network_key: str = "") -> MemoryTransport:
        return MemoryTransport(self, node_id, network_key)

    def linked(self, a: str, b: str) -> bool:
        return (
            a != b
            and a in self._nodes
            and b in self._nodes
            and self._nodes[a].running
            and self._nodes[b].running
            and self._nodes[a].network_key == self._nodes[b].network_key
            and frozenset((a, b)) not in self._cut
        )

    def partition(self, *groups: set[str]) -> None:
        """Cut every link between nodes of different groups."""
        before = self._links()
        for i, g in enumerate(groups):
            for h in groups[i + 1 :]:
                self._cut.update(frozenset((a, b)) for a in g for b in h)
        self._announce(before)

    def heal(self) -> None:
        before = self._links()
        self._cut.clear()
        self._silent.clear()
        self._announce(before)

    def silence(self, node_id: str) -> None:
        """The node falls silent as a machine that lost power does: nothing it sends arrives,
        nothing reaches it, requests to it time out, and no peer is told it disconnected."""
        self._silent.add(node_id)

    def _heard(self, a: str, b: str) -> bool:
        return self.linked(a, b) and a not in self._silent and b not in self._silent

    def _links(self) -> set[frozenset[str]]:
        ids = list(self._nodes)
        return {frozenset((a, b)) for a in ids for b in ids if self.linked(a, b)}

    def _announce(self, before: set[frozenset[str]]) -> None:
        # In sorted order: a set of strings iterates in an order that changes with each
        # process's hash seed, and the order nodes hear of peers steers the run.
        after = self._links()
        for a, b in _sorted_links(after - before):
            self._nodes[a].push(PeerConnected(b))
            self._nodes[b].push(PeerConnected(a))
        for a, b in _sorted_links(before - after):
            self._nodes[a].push(PeerDisconnected(b))
            self._nodes[b].push(PeerDisconnected(a))

    def _join(self, node: MemoryTransport) -> None:
        before = self._links()
        self._nodes[node.node_id] = node
        self._announce(before)

    def _leave(self, node: MemoryTransport) -> None:
        before = self._links()
        node.running = False
        self._announce(before)
        del self._nodes[node.node_id]

    def request_lost(self) -> str | None:
        """Which part of a request the network loses: "request", "answer" or None."""
        if not self.faults.request_loss or self.rng.random() >= self.faults.request_loss:
            return None
        return self.rng.choice(["request", "answer"])

    def _deliver(self, sender: str, topic: str, payload: bytes) -> None:
        for peer in list(self._nodes.values()):
            if not self._heard(sender, peer.node_id) or topic not in peer.topics:
                continue
            if self.rng.random() < self.faults.loss:
                continue
            copies = 2 if self.rng.random() < self.faults.duplication else 1
            for _ in range(copies):
                message = TransportMessage(topic, sender, payload)
                if self.rng.random() < self.faults.reorder:
                    delay = self.rng.uniform(0, self.faults.max_delay)
                    asyncio.get_running_loop().call_later(delay, peer.push, message)
                else:
                    peer.push(message)


def _sorted_links(links: set[frozenset[str]]) -> list[tuple[str, str]]:
    pairs = (sorted(link) for link in links)
    return sorted((a, b) for a, b in pairs)


class MemoryTransport(Transport):
    def __init__(self, network: MemoryNetwork, node_id: str, network_key: str = "") -> None:
        self._network = network
        self._id = node_id
        self.network_key = network_key
        self.running = False
        self.topics: set[str] = set()
        self._inbox: asyncio.Queue[TransportEvent | None] = asyncio.Queue()
        self._dropped = 0
        self._handler: RequestHandler | None = None

    @property
    def node_id(self) -> str:
        return self._id

    async def start(self) -> None:
        if self._id in self._network._nodes:
            raise RequestFailed(f"node id {self._id} is already on this network")
        self.running = True
        self._network._join(self)

    async def stop(self) -> None:
        if self.running:
            self._network._leave(self)
            self._inbox.put_nowait(None)

    async def subscribe(self, topic: str) -> None:
        self.topics.add(topic)

    async def publish(self, topic: str, payload: bytes) -> None:
        if not self.running:
            raise RequestFailed("transport is stopped")
        self._network._deliver(self._id, topic, payload)

    async def request(self, peer: str, payload: bytes, timeout: float = 10.0) -> bytes:
        if not self._network.linked(self._id, peer):
            raise RequestFailed(f"peer {peer} is not reachable")
        target = self._network._nodes[peer]
        if target._handler is None:
            raise RequestFailed(f"peer {peer} answers no requests")
        try:
            async with asyncio.timeout(timeout):
                lost = self._network.request_lost()
                if not self._network._heard(self._id, peer) or lost == "request":
                    await asyncio.sleep(timeout + 1)  # no answer ever comes
                answer = await target._handler(self._id, payload)
                if lost == "answer":
                    await asyncio.sleep(timeout + 1)
                return answer
        except TimeoutError as e:
            raise RequestFailed(f"request to {peer} timed out after {timeout}s") from e
        except RequestFailed:
            raise
        except Exception as e:
            raise RequestFailed(f"peer {peer} failed to answer: {e!r}") from e

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._handler = handler

    def peers(self) -> frozenset[str]:
        return frozenset(p for p in self._network._nodes if self._network.linked(self._id, p))

    def push(self, event: TransportEvent) -> None:
        """Called by the network: queue one inbound event, or count it dropped when full."""
        if not self.running:
            return
        if self._inbox.qsize() >= self._network.inbox_limit:
            self._dropped += 1
            return
        if self._dropped:
            self._inbox.put_nowait(TransportLagged(self._dropped))
            self._dropped = 0
        self._inbox.put_nowait(event)

    async def events(self) -> AsyncIterator[TransportEvent]:
        while True:
            event = await self._inbox.get()
            if event is None:
                return
            yield event
