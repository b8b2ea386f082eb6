"""How the control plane scales: N nodes (default 100) in the deterministic simulation.

    .venv/bin/python bench/bench_sim_scale.py [NODES] [CATCH_UP_EVENTS]

Every node is a real `Node` (election, master, replica, telemetry, durable log and snapshots)
on the in-memory transport, in virtual time (exo_core/testing/simulation.py), with the
production election timing. Printed, side by side for each cluster size given:

* forming: virtual and real seconds until every node's state holds all N;
* a steady window (120 s virtual: reports repeat, only coalescing's 60 s refresh is logged)
  and a busy one (30 s: every report moves free memory by 5 %, so each is news): telemetry
  commands and events committed per second, bytes per second the master sends and all nodes
  send (campaigns, event broadcasts, requests and answers; a broadcast counted once per
  receiver), log growth per hour (events; MB uncut; the data directory's bound with the log
  cut behind a snapshot every 10,000 events), and the CPU each virtual second costs the master
  and an average follower (real CPU of the one Python thread that runs every node, attributed
  to the node whose task ran);
* commands: 200 commands sent one at a time from a follower: the real time each takes (the
  in-memory network has no latency, so it is the CPU path of a commit through the sender, the
  master and N - 1 followers' acks) and the master's real CPU per command;
* failover: the master is killed (its peers see its connections drop), then the next one falls
  silent (`MemoryNetwork.silence`: a power loss, only the heartbeat timeout tells); virtual
  seconds until every survivor's state names a master of a newer term (the issue's bound:
  < 3 s at 100 nodes; tests/cluster/test_simulation_scale.py asserts it);
* catch-up: a master holding CATCH_UP_EVENTS events (default 1,000,000) behind snapshots, and a
  late joiner: real and virtual seconds until it holds the master's last index (it copies
  the snapshot, i.e. the state, not the events).

Every node's log and snapshots are real files, but fsync is skipped: here 100 nodes share one
disk, where each real node has its own (with fsync, the 100 followers' fsyncs of every
broadcast batch take most of the run). Real seconds are CPU-bound Python on a shared machine:
noisy. Never asserts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec

from exo_core.commands import AddModelCard
from exo_core.events import TopologyReported
from exo_core.ids import ModelId, NodeId
from exo_core.model_cards import ModelCard
from exo_core.node import Node
from exo_core.testing.harness import converged
from exo_core.testing.simulation import SimCluster, SimNode, run_simulation, sim_cluster
from exo_core.transport.memory import MemoryNetwork, MemoryTransport

STEADY_S = 120.0  # two of coalescing's 60 s refreshes
BUSY_S = 30.0
COMMANDS = 200

# -- CPU per node: every node's tasks descend from its `Node.run`, which sets this variable --

_NODE: contextvars.ContextVar[str] = contextvars.ContextVar("bench_node", default="")
cpu: dict[str, float] = defaultdict(float)


def _install_cpu_accounting() -> None:
    original_run = asyncio.events.Handle._run  # pyright: ignore[reportPrivateUsage]

    def timed_run(self: asyncio.events.Handle) -> None:
        started = time.thread_time()
        try:
            original_run(self)
        finally:
            node = self._context.get(_NODE, "")  # pyright: ignore[reportPrivateUsage]
            cpu[node] += time.thread_time() - started

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
    node_run = Node.run

    async def run(self: Node) -> None:
        _NODE.set(str(self.transport.node_id))
        await node_run(self)

    Node.run = run  # type: ignore[method-assign]


# -- bytes on the wire -------------------------------------------------------------------------

sent: dict[str, int] = defaultdict(int)  # "<sender> <topic>" -> bytes delivered (each copy)


def _install_byte_counting() -> None:
    deliver = MemoryNetwork._deliver  # pyright: ignore[reportPrivateUsage]
    request = MemoryTransport.request

    def counted(self: MemoryNetwork, sender: str, topic: str, payload: bytes) -> None:
        receivers = sum(1 for p in list(self._nodes) if self.linked(sender, p))  # pyright: ignore[reportPrivateUsage]
        sent[f"{sender} {topic}"] += len(payload) * receivers
        deliver(self, sender, topic, payload)

    async def counted_request(
        self: MemoryTransport, peer: str, payload: bytes, timeout: float = 10.0
    ) -> bytes:
        # The peer's handler runs in the caller's task here: its CPU is the peer's.
        token = _NODE.set(peer)
        try:
            answer = await request(self, peer, payload, timeout)
        finally:
            _NODE.reset(token)
        sent[f"{self.node_id} request"] += len(payload)
        sent[f"{peer} answer"] += len(answer)
        return answer

    MemoryNetwork._deliver = counted  # type: ignore[method-assign]
    MemoryTransport.request = counted_request  # type: ignore[method-assign]


# -- telemetry as machines send it ---------------------------------------------------------------

# Busy: every report moves free memory by 5 % of the total (more than coalescing's 2 % step),
# so every report is news; steady: reports repeat, and only the 60 s refresh is logged.
busy = False
_reports: dict[str, int] = defaultdict(int)


def _install_telemetry() -> Any:
    """Patches for the simulation: telemetry timestamps in virtual time (coalescing's 60 s
    refresh reads them), and free memory that moves while `busy`."""
    from unittest import mock

    import exo_core.reporting

    steady = exo_core.reporting.gather_resources

    def resources(*args: Any, **kwargs: Any) -> Any:
        found = steady(*args, **kwargs)
        _reports[args[0]] += 1  # per node (its data directory)
        if not busy:
            return found
        step = found.memory_total // 20
        return msgspec.structs.replace(
            found, memory_available=found.memory_total // 2 + step * (_reports[args[0]] % 2)
        )

    class VirtualClock:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def time(self) -> float:
            return 1.8e9 + anyio.current_time()

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("exo_core.reporting.gather_resources", resources))
    # Telemetry's timestamps (reporting) and the node's start (node) on the virtual clock.
    stack.enter_context(mock.patch("exo_core.reporting.time", VirtualClock()))
    stack.enter_context(mock.patch("exo_core.node.time", VirtualClock()))
    return stack


def bytes_from(prefix: str = "") -> int:
    return sum(v for k, v in sent.items() if k.startswith(prefix))


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def card(i: int) -> ModelCard:
    return ModelCard(
        model_id=ModelId(f"card-{i}"),
        family="llama",
        n_layers=1,
        hidden_size=8,
        storage_size_bytes=1,
    )


def the_master(cluster: SimCluster) -> SimNode:
    (master,) = cluster.masters()
    return master


def master_term(node: Node) -> int:
    return node.state.master.term if node.state.master else -1


class Figures(dict[str, str]):
    def put(self, name: str, value: str) -> None:
        self[name] = value
        print(f"  {name}: {value}", flush=True)


async def measure(root: Path, n: int, figures: Figures) -> None:
    network = MemoryNetwork(seed=1)
    real = time.perf_counter()
    with _install_telemetry():  # inside the simulation: over its fixed resources
        await measure_cluster(root, n, network, real, figures)


async def measure_cluster(
    root: Path, n: int, network: MemoryNetwork, real: float, figures: Figures
) -> None:
    async with sim_cluster(root, n, network) as cluster:
        await cluster.wait(
            lambda: all(len(s.node.state.nodes) == n for s in cluster.nodes), timeout=600
        )
        await cluster.wait(cluster.converged, timeout=600)
        figures.put("formed (virtual s)", f"{anyio.current_time():.1f}")
        figures.put("formed (real s)", f"{time.perf_counter() - real:.1f}")

        master = the_master(cluster)
        await anyio.sleep(10.0)  # past the joining burst
        await window(cluster, master, "steady", figures, STEADY_S)
        global busy
        busy = True
        await window(cluster, master, "busy", figures, BUSY_S)
        busy = False
        await commands_and_failover(cluster, master, figures)


async def window(
    cluster: SimCluster, master: SimNode, kind: str, figures: Figures, seconds: float
) -> None:
    """Telemetry, bytes, log growth and CPU over `seconds` of virtual time."""
    m_id = str(master.node.transport.node_id)
    assert master.node.master is not None
    first, seen = master.node.replica.next_index, master.node.master.commands_seen
    disk0 = disk_bytes(master.node.config.data_path)
    bytes0, master_bytes0 = bytes_from(), bytes_from(f"{m_id} ")
    cpu0 = dict(cpu)
    real = time.perf_counter()
    await anyio.sleep(seconds)
    real_window = time.perf_counter() - real
    events = master.node.replica.next_index - first
    commands = master.node.master.commands_seen - seen
    figures.put(f"{kind}: telemetry commands / s", f"{commands / seconds:.1f}")
    figures.put(f"{kind}: events committed / s", f"{events / seconds:.1f}")
    master_sent = (bytes_from(f"{m_id} ") - master_bytes0) / seconds
    figures.put(f"{kind}: bytes / s the master sends", f"{master_sent:,.0f}")
    figures.put(f"{kind}: bytes / s all nodes send", f"{(bytes_from() - bytes0) / seconds:,.0f}")
    growth = disk_bytes(master.node.config.data_path) - disk0
    figures.put(f"{kind}: log growth / hour (events)", f"{events / seconds * 3600:,.0f}")
    per_event = growth / max(1, events)
    figures.put(
        f"{kind}: log growth / hour uncut (MB)",
        f"{events / seconds * 3600 * per_event / 1e6:,.1f} ({per_event:.0f} B/event)",
    )
    every = master.node.replica.snapshot_every
    snapshot = len(msgspec.msgpack.encode(master.node.state))  # what a snapshot holds
    figures.put(
        f"{kind}: data dir bound, compacted (MB)",
        f"{(every * per_event + snapshot) / 1e6:,.1f} (a {every:,}-event log and a "
        f"{snapshot / 1e6:.2f} MB snapshot)",
    )
    followers = [str(s.node.transport.node_id) for s in cluster.alive() if s is not master]
    master_cpu = cpu[m_id] - cpu0.get(m_id, 0.0)
    follower_cpu = statistics.mean(cpu[f] - cpu0.get(f, 0.0) for f in followers)
    figures.put(f"{kind}: master CPU per s (ms)", f"{master_cpu / seconds * 1000:.1f}")
    figures.put(f"{kind}: follower CPU per s (ms)", f"{follower_cpu / seconds * 1000:.2f}")
    figures.put(f"{kind}: real s per virtual s", f"{real_window / seconds:.2f}")


async def commands_and_failover(cluster: SimCluster, master: SimNode, figures: Figures) -> None:
    m_id = str(master.node.transport.node_id)
    sender = next(s for s in cluster.alive() if s is not master)
    latencies = []
    cpu0 = dict(cpu)
    for i in range(COMMANDS):
        t = time.perf_counter()
        result = await sender.node.send_command(AddModelCard(card=card(i)), timeout=30)
        assert result.ok, result
        latencies.append(time.perf_counter() - t)
    # The in-memory network has no latency: this is the CPU path of a commit through every
    # node (sender, master, N - 1 followers' acks), all on one Python thread.
    median = statistics.median(latencies) * 1000
    figures.put("commit latency (real ms, median)", f"{median:.1f}")
    per_command = (cpu[m_id] - cpu0.get(m_id, 0.0)) / COMMANDS * 1000
    figures.put("master CPU per command (ms)", f"{per_command:.2f}")

    old = master_term(master.node)
    await cluster.kill(master)
    killed = anyio.current_time()
    await cluster.wait(
        lambda: cluster.converged() and all(master_term(s.node) > old for s in cluster.alive()),
        timeout=120,
    )
    figures.put("failover after kill (virtual s)", f"{anyio.current_time() - killed:.2f}")

    (master,) = cluster.masters()
    old = master_term(master.node)
    cluster.network.silence(master.node.transport.node_id)
    silenced = anyio.current_time()
    rest = [s.node for s in cluster.alive() if s is not master]
    await cluster.wait(
        lambda: converged(rest) and all(master_term(n) > old for n in rest), timeout=120
    )
    figures.put("failover, master silent (virtual s)", f"{anyio.current_time() - silenced:.2f}")


async def catch_up(root: Path, events: int, figures: Figures) -> None:
    network = MemoryNetwork(seed=2)
    async with sim_cluster(root, 1, network) as cluster:
        await cluster.wait(lambda: bool(cluster.masters()), timeout=60)
        master = the_master(cluster).node
        assert master.master is not None
        real = time.perf_counter()
        for start in range(0, events, 1000):
            batch = [
                TopologyReported(node_id=NodeId(f"peer-{i % 50}"), peers=())
                for i in range(start, min(events, start + 1000))
            ]
            await master.master.commit(list(batch))
        figures.put(
            f"master log of {master.replica.next_index:,} events written (real s)",
            f"{time.perf_counter() - real:.1f}",
        )
        target = master.replica.next_index
        real, virtual = time.perf_counter(), anyio.current_time()
        joiner = await cluster.start(1)
        await cluster.wait(lambda: joiner.node.replica.next_index >= target, timeout=3600)
        took = time.perf_counter() - real
        replica = joiner.node.replica
        state_bytes = len(msgspec.msgpack.encode(master.state))
        figures.put(
            "late joiner caught up (real ms / virtual s)",
            f"{took * 1000:.0f} / {anyio.current_time() - virtual:.2f} (it installed a snapshot "
            f"to event {replica.first_index - 1:,}, a {state_bytes / 1000:.1f} kB state, and "
            f"copied a {replica.next_index - replica.first_index:,}-event tail)",
        )


def main(sizes: list[int], catch_up_events: int) -> None:
    os.fsync = lambda fd: None  # one shared disk for every node (see the docstring)
    _install_cpu_accounting()
    _install_byte_counting()
    table: dict[int, Figures] = {}
    for n in sizes:
        print(f"{n} nodes:", flush=True)
        table[n] = Figures()
        with tempfile.TemporaryDirectory() as tmp:
            run_simulation(lambda n=n, tmp=tmp: measure(Path(tmp), n, table[n]))
    if catch_up_events:
        print("catch-up:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            run_simulation(lambda: catch_up(Path(tmp), catch_up_events, Figures()))
    print()
    print(f"{'figure':<44}" + "".join(f"{str(n) + ' nodes':>16}" for n in sizes))
    for name in table[sizes[0]]:
        row = [table[n].get(name, "-").split(" (")[0] for n in sizes]
        print(f"{name:<44}" + "".join(f"{v:>16}" for v in row))


def _sizes(arg: str) -> Iterator[int]:
    return (int(x) for x in arg.split(","))


if __name__ == "__main__":
    main(
        list(_sizes(sys.argv[1])) if len(sys.argv) > 1 else [100],
        int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000,
    )
