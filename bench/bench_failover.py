"""Failover among real `exo` processes over libp2p on loopback.

    .venv/bin/python bench/bench_failover.py [ROUNDS] [NODES]

Each round starts a fresh cluster of NODES (default 3) `--no-worker` nodes, node 0 forced
master and started first; once every node's state names it master, node 0 is killed with
kill -9 and the survivors' `/state/master` is polled every 20 ms. Printed per round and as a
median: the time from the kill until every survivor's replicated state names a master of a
newer term (the same condition as tests/cluster/test_libp2p_cluster.py). Never asserts on time.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until


def master_term(node: ExoProcess) -> int:
    master = node.get("/state/master", timeout=2.0)
    return int(master["term"]) if master else -1


def one_round(root: Path, nodes_count: int) -> float:
    def master_first(node: ExoProcess) -> None:
        if node.index == 0:
            wait_until(lambda: node.get("/healthz")["master"] is not None, timeout=60)

    with exo_processes(
        root,
        nodes_count,
        extra_args=[["--force-master", "--no-worker"]] + [["--no-worker"]] * (nodes_count - 1),
        after_start=master_first,
    ) as nodes:
        wait_until(lambda: all(len(n.state()["nodes"]) == nodes_count for n in nodes), timeout=90)
        master_id = nodes[0].get("/node_id")["node_id"]
        wait_until(lambda: all(n.state()["master"]["node_id"] == master_id for n in nodes))
        time.sleep(1.0)  # let heartbeats and telemetry settle into their rhythm
        old_term = master_term(nodes[1])
        nodes[0].kill()  # kill -9
        killed_at = time.monotonic()
        survivors = nodes[1:]
        wait_until(
            lambda: all(master_term(n) > old_term for n in survivors), timeout=30, interval=0.02
        )
        return time.monotonic() - killed_at


def main(rounds: int, nodes_count: int) -> None:
    times = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            took = one_round(Path(tmp), nodes_count)
        times.append(took)
        print(f"round {i + 1}: new master in every survivor's state after {took:.2f}s", flush=True)
    print(
        f"failover among {nodes_count} nodes, kill -9 of the master, {rounds} rounds: "
        f"median {statistics.median(times):.2f}s, min {min(times):.2f}s, max {max(times):.2f}s"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
