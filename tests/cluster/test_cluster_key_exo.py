"""Real `exo` processes on loopback: only nodes with the same cluster key form a cluster.

Node 0 and node 2 share a key; node 1 has another one and dials node 0 every 2 s. It never gets
past the private network's handshake, so neither side ever lists the other.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from exo_core.cluster_key import KEY_FILE
from exo_core.testing.processes import exo_processes, wait_until

pytestmark = [pytest.mark.slow]


def test_nodes_with_different_cluster_keys_never_connect(tmp_path: Path) -> None:
    keys = ["the-cluster-key", "another-key", "the-cluster-key"]
    args = [["--no-worker", "--cluster-key", key] for key in keys]
    with exo_processes(tmp_path, 3, extra_args=args) as nodes:
        ids: list[str] = []

        def ids_known() -> bool:
            ids[:] = [str(node.get("/node_id")["node_id"]) for node in nodes]
            return True

        wait_until(ids_known, timeout=180)  # a loaded machine takes a while to start them
        same, other = {ids[0], ids[2]}, ids[1]
        try:
            wait_until(lambda: set(nodes[0].state()["nodes"]) == same, timeout=120)
            wait_until(lambda: set(nodes[2].state()["nodes"]) == same, timeout=60)
        except TimeoutError:
            pytest.fail("nodes with the same key did not join:\n" + nodes[2].log()[-3000:])
        time.sleep(4)  # node 1 has dialed node 0 twice more by now
        for node in (nodes[0], nodes[2]):
            assert other not in node.state()["nodes"]
            assert other not in str(node.state()["topology"])  # not even as a reachable peer
        assert set(nodes[1].state()["nodes"]) <= {other}
        # Each node saved the key it was given, so a restart needs no option.
        for i, key in enumerate(keys):
            assert (tmp_path / f"node{i}" / KEY_FILE).read_text().strip() == key
