"""Partitions and faults on a real network (namespaces + the link emulator), Jepsen-style.

Three exo processes, each in its own network namespace, meet by mDNS alone over links of 1 ms
a hop. While clients write through every node (`History`), the network is partitioned, made
lossy and jittery, flapped, a node is paused and the master killed; after each scenario the
network heals and the check runs: every node holds the same log, every acknowledged write is
in it exactly once. The scenarios share one cluster (its start costs ~20 s) and run in order.
Needs root; skipped where there is no test network (see docs/testing-network.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exo_core.testing.history import History, Op, read_log
from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import (
    EmulatedNetwork,
    emulated_network,
    exo_on_network,
    network_problem,
)
from exo_core.testing.processes import ExoProcess, wait_joined, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.network]

HOP = LinkSpec(delay_ms=1)
# What the issue asks commits and failover to survive: 5 % loss and 50 ms of jitter a link.
LOSSY = LinkSpec(delay_ms=50, jitter_ms=50, loss=0.05)
FAILOVER_BOUND_S = 5.0


@dataclass
class Cluster:
    net: EmulatedNetwork
    nodes: list[ExoProcess]
    history: History

    def master(self, among: list[int] | None = None) -> int:
        """The index of the master that every node of `among` (default: all) follows."""
        among = list(range(len(self.nodes))) if among is None else among
        ids = self.history.node_ids
        found: list[int] = []

        def agreed() -> bool:
            masters = {self.nodes[i].get("/healthz")["master"] for i in among}
            if len(masters) == 1 and (m := masters.pop()) in ids and ids.index(m) in among:
                found[:] = [ids.index(m)]
                return True
            return False

        wait_until(agreed, timeout=60, interval=0.05)
        return found[0]

    def heal_and_check(self) -> None:
        """Heal the network, wait until every node holds the same log, then check it."""
        self.net.heal_all()
        self.net.set_link(HOP)
        for node in self.nodes:
            node.resume()

        def converged() -> bool:
            tips = {(h["master"], h["last_index"]) for h in (n.get("/healthz") for n in self.nodes)}
            return len(tips) == 1 and None not in next(iter(tips))

        try:
            wait_until(converged, timeout=90)
        except TimeoutError:
            tails = {n.index: n.log().splitlines()[-30:] for n in self.nodes}
            raise AssertionError(f"the healed nodes did not converge; logs end: {tails}") from None
        upto = min(n.get("/healthz")["last_index"] for n in self.nodes)
        logs = [read_log(n, upto) for n in self.nodes]
        problems = self.history.check(logs)
        assert not problems, f"{problems[:10]} (history: {self.history.summary()})"
        assert self.history.acknowledged(), "no write was acknowledged at all"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if (problem := network_problem()) is not None:
        pytest.skip(f"no test network here: {problem}")
    root = tmp_path_factory.mktemp("faults")
    with emulated_network(3, HOP, seed=28) as net, exo_on_network(net, root) as nodes:
        wait_joined(nodes, timeout=120)
        cluster = Cluster(net, nodes, History(nodes))
        cluster.master()
        yield cluster


def failover(cluster: Cluster, victim: int) -> float:
    """kill -9 node `victim` (the master); seconds until the survivors follow a new master."""
    survivors = [i for i in range(len(cluster.nodes)) if i != victim]
    cluster.nodes[victim].kill()
    killed = time.monotonic()
    try:
        new = cluster.master(among=survivors)
    except TimeoutError:
        tails = {i: cluster.nodes[i].log().splitlines()[-40:] for i in survivors}
        raise AssertionError(f"no new master in 60 s; the survivors' logs end: {tails}") from None
    took = time.monotonic() - killed
    assert new != victim
    # The target is 2.5 s at 1 ms a hop (measured, printed, in docs/testing-network.md);
    # twice that, on a machine shared with other work, is a failover that went wrong.
    assert took < FAILOVER_BOUND_S, f"failover took {took:.2f} s"
    return took


def acked_between(ops: list[Op], nodes: set[int], start: float, end: float) -> list[Op]:
    """Writes through `nodes` sent at `start` or later and acknowledged by `end` (one sent
    just before a partition may be committed before it and answered just after)."""
    return [
        op
        for op in ops
        if op.acknowledged and op.node in nodes and start <= op.start <= (op.end or 0) <= end
    ]


def test_partitioned_minority_cannot_commit_and_the_majority_goes_on(cluster: Cluster) -> None:
    old = cluster.master()
    majority = [i for i in range(3) if i != old]
    with cluster.history.writers(cluster.nodes):
        time.sleep(1)
        cluster.net.partition([old], majority)
        cut = time.monotonic()
        cluster.master(among=majority)  # the majority elects a new master
        refused = cluster.history.write(cluster.nodes[old])  # the cut-off old master
        time.sleep(5)
        healed = time.monotonic()
        cluster.net.heal_all()
    ops = cluster.history.ops
    assert refused.status == 503 and "majority" in refused.detail, refused
    print(f"the cut-off master refused a write after {refused.end - refused.start:.1f} s")
    assert not acked_between(ops, {old}, cut, healed), "the cut-off node acknowledged a write"
    assert acked_between(ops, set(majority), cut, healed), "the majority committed nothing"
    cluster.heal_and_check()


def test_a_cut_off_follower_says_it_cannot_commit(cluster: Cluster) -> None:
    master = cluster.master()
    follower = (master + 1) % 3
    with cluster.history.writers([n for n in cluster.nodes if n.index != follower]):
        cluster.net.isolate(follower)
        cut = time.monotonic()
        refused = cluster.history.write(cluster.nodes[follower])
        healed = time.monotonic()
        cluster.net.heal_all()
    assert refused.status == 503, refused
    assert "1 of the cluster's 3 members, not a majority" in refused.detail, refused
    print(f"the cut-off follower refused a write after {refused.end - refused.start:.1f} s")
    assert acked_between(cluster.history.ops, {master}, cut, healed), "the majority stopped"
    cluster.heal_and_check()


def test_commits_complete_with_loss_and_jitter_and_failover_too(cluster: Cluster) -> None:
    cluster.net.set_link(LOSSY)
    with cluster.history.writers(cluster.nodes):
        start = time.monotonic()
        time.sleep(15)
        end = time.monotonic()
    window = [op for op in cluster.history.ops if start <= op.start and (op.end or 0) <= end]
    assert window and all(op.acknowledged for op in window), [
        (op.status, op.detail) for op in window if not op.acknowledged
    ][:5]
    victim = cluster.master()
    took = failover(cluster, victim)
    print(f"failover with 5 % loss and 50 ms jitter: {took:.2f} s")
    cluster.nodes[victim].start()  # the same data: it rejoins and catches up
    wait_joined(cluster.nodes, timeout=120)
    cluster.heal_and_check()


def test_a_flapping_link(cluster: Cluster) -> None:
    master = cluster.master()
    follower = (master + 1) % 3
    with cluster.history.writers(cluster.nodes):
        for _ in range(15):  # down 2 s, up 2 s, for a minute
            cluster.net.cut(master, follower)
            time.sleep(2)
            cluster.net.heal(master, follower)
            time.sleep(2)
    cluster.heal_and_check()


def test_a_paused_master(cluster: Cluster) -> None:
    master = cluster.master()
    others = [i for i in range(3) if i != master]
    with cluster.history.writers([cluster.nodes[i] for i in others]):
        cluster.nodes[master].pause()  # SIGSTOP for 30 s
        paused = time.monotonic()
        assert cluster.master(among=others) != master
        time.sleep(max(0.0, 30 - (time.monotonic() - paused)))
        cluster.nodes[master].resume()
        time.sleep(3)
    cluster.heal_and_check()


def test_failover_after_kill_9_at_1_ms_a_hop(cluster: Cluster, tmp_path: Path) -> None:
    victim = cluster.master()
    with cluster.history.writers(cluster.nodes):
        time.sleep(1)
        took = failover(cluster, victim)
        time.sleep(2)
    print(f"failover after kill -9 at 1 ms a hop: {took:.2f} s")
    cluster.nodes[victim].start()
    wait_joined(cluster.nodes, timeout=120)
    cluster.heal_and_check()
