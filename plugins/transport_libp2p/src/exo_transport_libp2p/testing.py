"""Helpers for tests that need real libp2p nodes: loopback clusters joined by bootstrap."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from exo_core.plugin.transport import Transport
from exo_core.testing.waiting import wait_until_async
from exo_transport_libp2p.transport import Libp2pTransport


def make_node(
    data_dir: Path,
    bootstrap: list[str] | None = None,
    namespace: str = "test",
    *,
    inbox_capacity: int = 8192,
    cluster_key: str | None = None,
) -> Libp2pTransport:
    """An unstarted node on 127.0.0.1 (any port), mDNS off."""
    return Libp2pTransport(
        data_dir,
        namespace,
        listen_host="127.0.0.1",
        bootstrap_peers=bootstrap or [],
        mdns=False,
        inbox_capacity=inbox_capacity,
        cluster_key=cluster_key,
    )


@contextlib.asynccontextmanager
async def libp2p_cluster(root: Path, n: int) -> AsyncIterator[list[Transport]]:
    """`n` started nodes under `root`, each bootstrapping to all earlier ones (a full mesh);
    yields once every node is connected to every other."""
    nodes: list[Libp2pTransport] = []
    try:
        for i in range(n):
            bootstrap = [a for node in nodes for a in node.listen_addrs()]
            node = make_node(root / f"node{i}", bootstrap)
            await node.start()
            nodes.append(node)
        ids = {node.node_id for node in nodes}
        await wait_until_async(lambda: all(node.peers() == ids - {node.node_id} for node in nodes))
        yield list(nodes)
    finally:
        for node in nodes:
            await node.stop()
