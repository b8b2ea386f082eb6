"""One node of the mDNS test, run inside a network namespace by test_libp2p_mdns.py.

Usage: python mdns_node.py DATA_DIR. Starts a node with mDNS on (no bootstrap peers), waits
for a peer, exchanges a broadcast with it, and prints one JSON line with what it saw."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from exo_core.plugin.transport import PeerConnected, TransportMessage
from exo_transport_libp2p.transport import Libp2pTransport


async def main(data_dir: Path) -> dict[str, object]:
    node = Libp2pTransport(data_dir, "mdns-test", listen_host="0.0.0.0", mdns=True)
    await node.start()
    await node.subscribe("hello")
    connected: list[str] = []
    heard: list[str] = []

    async def chatter() -> None:
        # Keep broadcasting until the other side has surely heard (it stops when we stop).
        while True:
            if connected:
                await node.publish("hello", f"hello from {node.node_id}".encode())
            await asyncio.sleep(0.3)

    talker = asyncio.create_task(chatter())
    try:
        async with asyncio.timeout(25):
            async for event in node.events():
                if isinstance(event, PeerConnected):
                    connected.append(event.peer)
                elif isinstance(event, TransportMessage):
                    heard.append(event.sender)
                    break
        await asyncio.sleep(1.5)  # let our own broadcasts reach the other side too
    except TimeoutError:
        pass
    finally:
        talker.cancel()
        await node.stop()
    return {"node_id": node.node_id, "connected": connected, "heard": heard}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))), flush=True)
