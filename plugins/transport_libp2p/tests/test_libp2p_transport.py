"""Behaviour of the libp2p transport beyond the conformance suite."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import stat
import time
from pathlib import Path

import pytest

from exo_core.plugin import NodeConfig
from exo_core.plugin.transport import (
    PeerConnected,
    RequestFailed,
    TransportError,
    TransportEvent,
    TransportLagged,
    TransportMessage,
)
from exo_core.testing.harness import free_port
from exo_core.testing.transport_conformance import inboxes
from exo_core.testing.waiting import wait_until_async
from exo_transport_libp2p import plugin
from exo_transport_libp2p.testing import libp2p_cluster, make_node
from exo_transport_libp2p.transport import KEY_FILE, Libp2pTransport


@pytest.mark.anyio
async def test_broadcast_crosses_a_line_of_nodes(tmp_path: Path) -> None:
    """A - B - C: C never connects to A, yet hears A's broadcasts through B."""
    a = make_node(tmp_path / "a")
    await a.start()
    b = make_node(tmp_path / "b", a.listen_addrs())
    await b.start()
    c = make_node(tmp_path / "c", b.listen_addrs())
    await c.start()
    nodes = [a, b, c]
    try:
        await wait_until_async(
            lambda: len(b.peers()) == 2 and len(a.peers()) == 1 == len(c.peers())
        )
        async with inboxes(list(nodes)) as (_, box_b, box_c):
            for node in nodes:
                await node.subscribe("line")
            async with asyncio.timeout(20):
                i = 0
                while not box_c.messages["line"]:
                    await a.publish("line", f"from a {i}".encode())
                    i += 1
                    await asyncio.sleep(0.2)
            heard = box_c.messages["line"][0]
            assert heard.sender == a.node_id
            assert heard.payload.startswith(b"from a")
            assert box_b.messages["line"], "B relays what it also receives"
            assert a.peers() == {b.node_id} and c.peers() == {b.node_id}, "still a line"
    finally:
        for node in nodes:
            await node.stop()


@pytest.mark.anyio
async def test_eight_mib_request(tmp_path: Path) -> None:
    async with libp2p_cluster(tmp_path, 2) as (a, b):
        payload = hashlib.sha256(b"seed").digest() * (8 * 1024 * 1024 // 32)

        async def digest(sender: str, body: bytes) -> bytes:
            return hashlib.sha256(body).digest() + body[:1024]

        b.set_request_handler(digest)
        answer = await a.request(b.node_id, payload, timeout=30)
        assert answer[:32] == hashlib.sha256(payload).digest()
        assert answer[32:] == payload[:1024]


@pytest.mark.anyio
async def test_different_namespaces_never_connect(tmp_path: Path) -> None:
    y = make_node(tmp_path / "y", namespace="y")
    await y.start()
    x = make_node(tmp_path / "x", y.listen_addrs(), namespace="x")
    await x.start()
    try:
        async with inboxes([x, y]) as (box_x, box_y):
            await asyncio.sleep(3)  # x dials at start and again every 2 s
            assert box_x.connected == [] and box_y.connected == []
            assert x.peers() == frozenset() and y.peers() == frozenset()
    finally:
        await x.stop()
        await y.stop()


@pytest.mark.anyio
async def test_only_nodes_with_the_same_cluster_key_connect(tmp_path: Path) -> None:
    a = make_node(tmp_path / "a", cluster_key="key-one")
    await a.start()
    stranger = make_node(tmp_path / "s", a.listen_addrs(), cluster_key="key-two")
    open_node = make_node(tmp_path / "o", a.listen_addrs())  # no key: the namespace alone
    friend = make_node(tmp_path / "f", a.listen_addrs(), cluster_key="key-one")
    for node in (stranger, open_node, friend):
        await node.start()
    try:
        await wait_until_async(lambda: a.peers() == {friend.node_id}, timeout=10)
        await asyncio.sleep(2.5)  # both outsiders have dialed again by now
        assert a.peers() == {friend.node_id}
        assert stranger.peers() == frozenset() and open_node.peers() == frozenset()
    finally:
        for node in (a, stranger, open_node, friend):
            await node.stop()


@pytest.mark.anyio
async def test_cloned_identity_is_replaced_by_the_younger_node(tmp_path: Path) -> None:
    a = make_node(tmp_path / "a")
    await a.start()
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / KEY_FILE, tmp_path / "b" / KEY_FILE)  # a copied data dir
    assert Libp2pTransport(tmp_path / "b", "test", check_identity=False).node_id == a.node_id
    # The node being created finds its twin among its bootstrap peers and takes a new key
    # before anyone reads its id.
    b = make_node(tmp_path / "b", a.listen_addrs())
    try:
        assert b.identity_regenerated
        assert b.node_id != a.node_id
        assert not a.identity_regenerated and a.node_id in a.listen_addrs()[0]
        assert Libp2pTransport(tmp_path / "b", "test").node_id == b.node_id, "persisted"
        await b.start()
        await wait_until_async(lambda: a.peers() == {b.node_id} and b.peers() == {a.node_id})
    finally:
        await b.stop()
        await a.stop()


@pytest.mark.anyio
async def test_identity_probe_is_invisible_to_peers(tmp_path: Path) -> None:
    a = make_node(tmp_path / "a")
    await a.start()
    b: Libp2pTransport | None = None
    try:
        async with inboxes([a]) as (box_a,):
            b = make_node(tmp_path / "b", a.listen_addrs())  # probes a
            assert not b.identity_regenerated
            await asyncio.sleep(0.5)
            assert box_a.connected == [], "the probe never completes a connection"
            await b.start()
            await box_a.wait_for(lambda: box_a.connected == [b.node_id] if b else False)
    finally:
        if b is not None:
            await b.stop()
        await a.stop()


@pytest.mark.anyio
async def test_identity_persists_with_private_key_file(tmp_path: Path) -> None:
    first = Libp2pTransport(tmp_path, "test")
    mode = stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode)
    assert mode == 0o600
    assert Libp2pTransport(tmp_path, "test").node_id == first.node_id


@pytest.mark.anyio
async def test_slow_reader_gets_a_lagged_event(tmp_path: Path) -> None:
    reader = make_node(tmp_path / "reader", inbox_capacity=8)
    await reader.start()
    writer = make_node(tmp_path / "writer", reader.listen_addrs())
    await writer.start()
    try:
        await wait_until_async(lambda: writer.node_id in reader.peers())
        await reader.subscribe("flood")
        await writer.subscribe("flood")
        await asyncio.sleep(1.5)  # subscriptions are exchanged
        for i in range(50):
            await writer.publish("flood", i.to_bytes(4, "big"))
        # Nobody reads yet: 8 are held, the other 42 are dropped and counted.
        await wait_until_async(lambda: reader.dropped_total() == 42)
        got: list[TransportEvent] = []
        async with asyncio.timeout(5):
            async for event in reader.events():
                got.append(event)
                if isinstance(event, TransportLagged):
                    break
        assert isinstance(got[0], PeerConnected)
        messages = [e for e in got if isinstance(e, TransportMessage)]
        assert [int.from_bytes(m.payload, "big") for m in messages] == list(range(8))
        assert got[-1] == TransportLagged(42)
    finally:
        await writer.stop()
        await reader.stop()


@pytest.mark.anyio
async def test_blocked_event_loop_does_not_stall_the_swarm(tmp_path: Path) -> None:
    async with libp2p_cluster(tmp_path, 2) as (a, b), inboxes([a, b]) as (_, box_b):
        await a.subscribe("t")
        await b.subscribe("t")
        await asyncio.sleep(1.5)
        for i in range(100):
            await a.publish("t", i.to_bytes(4, "big"))
        time.sleep(1.0)  # Python is stuck; the swarm keeps receiving into its queue
        assert b.peers() == {a.node_id}
        await box_b.wait_for(lambda: len(box_b.messages["t"]) == 100, timeout=5)


@pytest.mark.anyio
async def test_publish_with_nobody_listening_is_fine(tmp_path: Path) -> None:
    a = make_node(tmp_path / "a")
    await a.start()
    try:
        await a.publish("nobody", b"hello?")
    finally:
        await a.stop()


@pytest.mark.anyio
async def test_request_timeout_and_stopped_peer(tmp_path: Path) -> None:
    async with libp2p_cluster(tmp_path, 2) as (a, b):

        async def slow(sender: str, body: bytes) -> bytes:
            await asyncio.sleep(5)
            return body

        b.set_request_handler(slow)
        started = time.monotonic()
        with pytest.raises(RequestFailed, match="timed out"):
            await a.request(b.node_id, b"x", timeout=0.3)
        assert time.monotonic() - started < 2
        await b.stop()
        with pytest.raises(RequestFailed):
            await a.request(b.node_id, b"x", timeout=3)


def test_plugin_hook_builds_the_transport(tmp_path: Path) -> None:
    config = NodeConfig(
        data_dir=str(tmp_path),
        namespace="n",
        bootstrap_peers=[],
        plugin_options={"libp2p_port": 0, "no_mdns": True},
    )
    transport = plugin.exo_transport(config=config)
    assert isinstance(transport, Libp2pTransport)
    assert transport.namespace == "n" and transport.mdns is False
    assert (tmp_path / KEY_FILE).exists()
    config.transport = "memory"
    assert plugin.exo_transport(config=config) is None


@pytest.mark.anyio
async def test_fixed_port_restart_and_redial(tmp_path: Path) -> None:
    """A node restarts on its fixed port; a peer that bootstraps to it dials it again. A second
    node on a port already taken is refused (libp2p alone would share it via SO_REUSEPORT)."""
    port = free_port()
    a = Libp2pTransport(tmp_path / "a", "test", listen_host="127.0.0.1", port=port, mdns=False)
    await a.start()
    b = make_node(tmp_path / "b", [f"/ip4/127.0.0.1/tcp/{port}"])  # no /p2p: any node there
    await b.start()
    twin = Libp2pTransport(tmp_path / "c", "test", listen_host="127.0.0.1", port=port, mdns=False)
    try:
        with pytest.raises(TransportError, match="in use"):
            await twin.start()
        await wait_until_async(lambda: b.peers() == {a.node_id})
        await a.stop()
        await wait_until_async(lambda: b.peers() == frozenset())
        a = Libp2pTransport(tmp_path / "a", "test", listen_host="127.0.0.1", port=port, mdns=False)
        await a.start()
        await wait_until_async(lambda: b.peers() == {a.node_id} and a.peers() == {b.node_id})
    finally:
        await twin.stop()
        await b.stop()
        await a.stop()


@pytest.mark.anyio
async def test_mutual_bootstrap_announces_each_peer_once(tmp_path: Path) -> None:
    """Two nodes dialing each other may hold two connections; events still come once."""
    port_a, port_b = free_port(), free_port()

    def node(name: str, port: int, other: int) -> Libp2pTransport:
        return Libp2pTransport(
            tmp_path / name,
            "test",
            listen_host="127.0.0.1",
            port=port,
            bootstrap_peers=[f"/ip4/127.0.0.1/tcp/{other}"],
            mdns=False,
            check_identity=False,
        )

    a, b = node("a", port_a, port_b), node("b", port_b, port_a)
    await a.start()
    await b.start()
    try:
        async with inboxes([a, b]) as (box_a, box_b):
            await wait_until_async(lambda: a.peers() == {b.node_id} and b.peers() == {a.node_id})
            await asyncio.sleep(2.5)  # both redial ticks have run
            assert box_a.connected == [b.node_id] and box_b.connected == [a.node_id]
            await b.stop()
            await box_a.wait_for(lambda: box_a.disconnected == [b.node_id])
            await asyncio.sleep(0.3)
            assert box_a.disconnected == [b.node_id]
    finally:
        await b.stop()
        await a.stop()
