"""Nodes whose logs were cut behind snapshots: a returning node and a new one catch up from the
master's snapshot and the tail, and a node restarted from its own snapshot rejoins."""

from __future__ import annotations

import time
from pathlib import Path

from loguru import logger

from exo_core.commands import AddModelCard
from exo_core.events import ModelCardAdded
from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard
from exo_core.testing.harness import running_cluster, running_node
from exo_transport_libp2p.transport import Libp2pTransport


def card(name: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(name), family="llama", n_layers=1, hidden_size=8, storage_size_bytes=1
    )


def test_late_joiners_catch_up_over_a_snapshot(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, api=False, snapshot_every=40) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        late = next(n for n in cluster.nodes if n.node.master is None)
        cluster.stop(late)
        (master,) = cluster.masters()
        for i in range(150):
            result = master.call(master.node.send_command, AddModelCard(card=card(f"m{i}")))
            assert result.ok
        replica = master.node.replica
        assert replica.snapshot is not None and replica.first_index > 0
        # The stopped node's log ends before the master's first kept event: it needs the snapshot.
        assert late.node.replica.next_index < replica.first_index

        installs: list[str] = []
        sink = logger.add(
            lambda m: installs.append(m), filter=lambda r: "installing" in r["message"]
        )
        try:
            rejoined = cluster.restart(cluster.nodes.index(late))
            newcomer = cluster.restart_node(3)  # an empty data directory
            cluster.nodes.append(newcomer)
            cluster.wait(cluster.converged, timeout=30)
        finally:
            logger.remove(sink)
        assert len(installs) == 2, "each joiner installs the master's snapshot"
        for node in (rejoined, newcomer):
            assert len(node.node.state.model_cards) == 150
            assert node.node.replica.first_index > 0


def test_a_late_joiner_over_libp2p_takes_the_snapshot(tmp_path: Path) -> None:
    """The same over the real transport: the snapshot travels as one libp2p request."""

    def transport(name: str, bootstrap: list[str]) -> Libp2pTransport:
        return Libp2pTransport(
            tmp_path / name, "snap", listen_host="127.0.0.1", bootstrap_peers=bootstrap, mdns=False
        )

    first = transport("a", [])
    options = {"api": False, "worker": False, "snapshot_every": 50}
    with running_node(tmp_path / "a", transport=first, **options) as a:
        master = a.node.master
        assert master is not None
        for start in range(0, 300, 20):
            a.call(
                master.commit,
                [ModelCardAdded(card=card(f"m{i}")) for i in range(start, start + 20)],
            )
        assert a.node.replica.first_index > 200
        late = transport("b", first.listen_addrs())
        with running_node(tmp_path / "b", transport=late, wait_ready=False, **options) as b:
            deadline = time.monotonic() + 30
            while b.node.state.model_cards != a.node.state.model_cards:
                assert time.monotonic() < deadline, "the late joiner did not catch up"
                time.sleep(0.05)
            assert b.node.replica.snapshot is not None
            assert b.node.replica.first_index > 200, "it replayed the log instead"
