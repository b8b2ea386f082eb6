"""Cluster figures on loopback over the real libp2p transport.

    uv run python bench/bench_cluster.py [N]

* catch-up: a master holds a log of N events (default 100,000), cut behind snapshots; a late
  joiner starts, finds it by bootstrap address, and copies the master's snapshot and the tail
  by request-response; prints the time until it holds the master's last index, and events/s;
* commit latency: commands acknowledged by a majority of two nodes, median and p99.
Never asserts on time.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from exo_core.commands import ReportEvents
from exo_core.events import TopologyReported
from exo_core.ids import NodeId
from exo_core.testing.harness import running_node
from exo_transport_libp2p.transport import Libp2pTransport


def transport(data: Path, bootstrap: list[str]) -> Libp2pTransport:
    return Libp2pTransport(
        data, "bench", listen_host="127.0.0.1", bootstrap_peers=bootstrap, mdns=False
    )


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a_transport = transport(root / "a", [])
        with running_node(root / "a", transport=a_transport, api=False, worker=False) as a:
            master = a.node.master
            assert master is not None
            started = time.perf_counter()
            for start in range(0, n, 1000):
                batch = [
                    TopologyReported(node_id=NodeId(f"peer-{i % 50}"), peers=())
                    for i in range(start, min(n, start + 1000))
                ]
                a.call(master.commit, batch)
            filled = time.perf_counter() - started
            target = a.node.replica.next_index
            print(f"master log: {target:,} events, written in {filled:.2f}s")

            b_transport = transport(root / "b", a_transport.listen_addrs())
            started = time.perf_counter()
            with running_node(
                root / "b", transport=b_transport, api=False, worker=False, wait_ready=False
            ) as b:
                while b.node.replica.next_index < target:
                    time.sleep(0.01)
                caught_up = time.perf_counter() - started
                print(
                    f"late joiner caught up {target:,} events in {caught_up:.2f}s "
                    f"({target / caught_up:,.0f} events/s, including start and discovery)"
                )
                joined = b.node.replica
                print(
                    f"  it holds a snapshot to event {joined.first_index - 1:,} and a "
                    f"{joined.next_index - joined.first_index:,}-event tail "
                    f"(the master: snapshot every {a.node.replica.snapshot_every:,} events)"
                )
                latencies = []
                for i in range(200):
                    # A fact about the follower itself: a node reports nothing about others.
                    command = ReportEvents(
                        events=(TopologyReported(node_id=b.node.node_id, peers=(NodeId(f"x{i}"),)),)
                    )
                    t = time.perf_counter()
                    result = b.call(b.node.send_command, command)
                    latencies.append(time.perf_counter() - t)
                    assert result.ok
                latencies.sort()
                print(
                    "command from a follower, acknowledged by a majority: "
                    f"median {statistics.median(latencies) * 1e3:.1f} ms, "
                    f"p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.1f} ms"
                )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
