"""Rotating the cluster key shuts out a machine that still holds the old one.

A real `exo` process runs with the old key, and a second libp2p peer holding it connects.
The operator rotates the key (restarts the node with `--cluster-key NEW`): the node saves the
new key, the peer with the old key never gets past the private network's handshake again,
and a peer with the new key connects. docs/security.md ("Rotating the key") cites this test.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from exo_core.cluster_key import KEY_FILE
from exo_core.testing.processes import exo_processes, wait_until
from exo_core.testing.waiting import wait_until_async
from exo_transport_libp2p.testing import make_node

pytestmark = pytest.mark.slow

OLD, NEW = "the-old-cluster-key", "the-new-cluster-key"


async def connects(
    root: Path, address: str, node_id: str, key: str, wait_s: float
) -> tuple[bool, str]:
    """Whether a peer holding `key` (under `root`) gets connected to the node in `wait_s`
    (it dials again and again meanwhile), and the peer's id."""
    peer = make_node(root, [address], "test-cluster", cluster_key=key)
    await peer.start()
    try:
        await wait_until_async(lambda: node_id in peer.peers(), timeout=wait_s)
        return True, peer.node_id
    except TimeoutError:
        return False, peer.node_id
    finally:
        await peer.stop()


def test_after_rotation_a_node_with_the_old_key_is_shut_out(tmp_path: Path) -> None:
    with exo_processes(tmp_path, 1, extra_args=[["--cluster-key", OLD]]) as (node,):
        wait_until(lambda: node.get("/node_id"), timeout=180)
        node_id = str(node.get("/node_id")["node_id"])
        member = tmp_path / "member"
        joined, member_id = asyncio.run(connects(member, node.bootstrap_addr, node_id, OLD, 60))
        assert joined

        # The rotation: the node restarts with the new key (every member must be given it).
        node.kill(signal.SIGINT)
        node.args[node.args.index(OLD)] = NEW
        node.start()
        wait_until(lambda: node.get("/node_id")["node_id"] == node_id, timeout=180)
        assert (node.data_dir / KEY_FILE).read_text().strip() == NEW

        joined, _ = asyncio.run(connects(member, node.bootstrap_addr, node_id, OLD, 12))
        assert not joined
        # The node's own report of its links (sent every 5 s) does not list the old member.
        assert member_id not in node.state()["topology"].get(node_id, [])
        joined, _ = asyncio.run(connects(tmp_path / "new", node.bootstrap_addr, node_id, NEW, 60))
        assert joined
