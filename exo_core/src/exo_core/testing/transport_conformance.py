"""The transport conformance suite: every transport must pass it.

Use it from a test module by importing the tests and providing one fixture, `transport_cluster`,
that returns an async context manager factory: `transport_cluster(n)` yields `n` started
transports that can all reach each other::

    from exo_core.testing.transport_conformance import *  # noqa: F403

    @pytest.fixture
    def transport_cluster():
        return my_cluster_factory

The in-memory transport runs it in `exo_core/tests/test_transport_memory.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from exo_core.transport.base import (
    PayloadTooLarge,
    PeerConnected,
    PeerDisconnected,
    RequestFailed,
    Transport,
    TransportMessage,
)

ClusterFactory = Callable[[int], AbstractAsyncContextManager[list[Transport]]]

__all__ = [
    "Inbox",
    "inboxes",
    "test_handler_error_is_request_failed",
    "test_large_payload_by_request",
    "test_large_publish_is_refused_or_delivered",
    "test_ordering_per_sender",
    "test_peer_leaving_is_seen_once",
    "test_publish_reaches_every_subscriber",
    "test_request_response",
    "test_request_to_unknown_peer_fails",
    "wait_mesh",
]


class Inbox:
    """Drains one transport's events in the background so a test can wait on them."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.messages: dict[str, list[TransportMessage]] = defaultdict(list)
        self.connected: list[str] = []
        self.disconnected: list[str] = []
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for event in self.transport.events():
            match event:
                case TransportMessage():
                    self.messages[event.topic].append(event)
                case PeerConnected():
                    self.connected.append(event.peer)
                case PeerDisconnected():
                    self.disconnected.append(event.peer)
                case _:
                    pass
            self._changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    def close(self) -> None:
        self._task.cancel()


@contextlib.asynccontextmanager
async def inboxes(transports: list[Transport]) -> AsyncIterator[list[Inbox]]:
    boxes = [Inbox(t) for t in transports]
    try:
        yield boxes
    finally:
        for box in boxes:
            box.close()


async def wait_mesh(transports: list[Transport], boxes: list[Inbox], topic: str) -> None:
    """Publish probes on `topic` until every node has heard every other one, then forget them.

    Gossip meshes form a moment after connecting; this makes tests independent of that."""
    for t in transports:
        await t.subscribe(topic)

    def everyone_heard() -> bool:
        return all(
            {m.sender for m in box.messages[topic]}
            >= {t.node_id for t in transports} - {me.node_id}
            for box, me in zip(boxes, transports, strict=True)
        )

    async with asyncio.timeout(30):
        while not everyone_heard():
            for t in transports:
                with contextlib.suppress(Exception):
                    await t.publish(topic, b"probe")
            await asyncio.sleep(0.2)
    await asyncio.sleep(0.3)  # let late probes land before the test starts counting
    for box in boxes:
        box.messages[topic].clear()


@pytest.mark.anyio
async def test_publish_reaches_every_subscriber(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(3) as nodes, inboxes(nodes) as boxes:
        await wait_mesh(nodes, boxes, "t")
        await nodes[0].publish("t", b"hello")
        for box in boxes[1:]:
            await box.wait_for(lambda box=box: len(box.messages["t"]) >= 1)
            assert box.messages["t"][0].payload == b"hello"
            assert box.messages["t"][0].sender == nodes[0].node_id
        await asyncio.sleep(0.3)
        assert boxes[0].messages["t"] == [], "a node must not receive its own broadcast"


@pytest.mark.anyio
async def test_ordering_per_sender(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(2) as nodes, inboxes(nodes) as boxes:
        await wait_mesh(nodes, boxes, "o")
        for i in range(200):
            await nodes[0].publish("o", i.to_bytes(4, "big"))
        await boxes[1].wait_for(lambda: len(boxes[1].messages["o"]) >= 200)
        got = [int.from_bytes(m.payload, "big") for m in boxes[1].messages["o"]]
        assert got == list(range(200))


@pytest.mark.anyio
async def test_request_response(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(2) as (a, b):

        async def echo(sender: str, payload: bytes) -> bytes:
            return sender.encode() + b":" + payload

        b.set_request_handler(echo)
        answer = await a.request(b.node_id, b"ping", timeout=10)
        assert answer == a.node_id.encode() + b":ping"


@pytest.mark.anyio
async def test_request_to_unknown_peer_fails(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(1) as (a,):
        with pytest.raises(RequestFailed):
            await a.request("no-such-peer", b"x", timeout=2)


@pytest.mark.anyio
async def test_handler_error_is_request_failed(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(2) as (a, b):

        async def broken(sender: str, payload: bytes) -> bytes:
            raise ValueError("boom")

        b.set_request_handler(broken)
        with pytest.raises(RequestFailed):
            await a.request(b.node_id, b"x", timeout=5)


@pytest.mark.anyio
async def test_large_payload_by_request(transport_cluster: ClusterFactory) -> None:
    big = bytes(range(256)) * (8 * 1024 * 1024 // 256)  # 8 MiB
    async with transport_cluster(2) as (a, b):

        async def size(sender: str, payload: bytes) -> bytes:
            return len(payload).to_bytes(8, "big") + payload[-16:]

        b.set_request_handler(size)
        answer = await a.request(b.node_id, big, timeout=30)
        assert int.from_bytes(answer[:8], "big") == len(big)
        assert answer[8:] == big[-16:]


@pytest.mark.anyio
async def test_large_publish_is_refused_or_delivered(transport_cluster: ClusterFactory) -> None:
    """A broadcast above the channel's limit raises `PayloadTooLarge` or arrives whole."""
    big = b"x" * (1024 * 1024)
    async with transport_cluster(2) as nodes, inboxes(nodes) as boxes:
        await wait_mesh(nodes, boxes, "big")
        try:
            await nodes[0].publish("big", big)
        except PayloadTooLarge:
            pass
        else:
            await boxes[1].wait_for(lambda: len(boxes[1].messages["big"]) >= 1)
            assert boxes[1].messages["big"][0].payload == big
        await nodes[0].publish("big", b"small")  # the node is still healthy
        await boxes[1].wait_for(
            lambda: any(m.payload == b"small" for m in boxes[1].messages["big"])
        )


@pytest.mark.anyio
async def test_peer_leaving_is_seen_once(transport_cluster: ClusterFactory) -> None:
    async with transport_cluster(3) as nodes, inboxes(nodes) as boxes:
        a, _, c = nodes
        await boxes[0].wait_for(lambda: {n.node_id for n in nodes[1:]} <= set(boxes[0].connected))
        assert sorted(boxes[0].connected) == sorted(n.node_id for n in nodes[1:]), "once per peer"
        await c.stop()
        await boxes[0].wait_for(lambda: c.node_id in boxes[0].disconnected)
        await asyncio.sleep(0.5)
        assert boxes[0].disconnected.count(c.node_id) == 1
        assert c.node_id not in a.peers()
