"""How big the event log grows, before and after snapshots, coalescing and prompt redaction.

    uv run python bench/bench_log_growth.py [REQUESTS] [HOURS]

Two workloads, each written twice into a fresh data directory:

* REQUESTS chat requests (default 10,000) on one instance: each logs its task, then running,
  then complete. Prompts are ~2 KB of chat text; one request in 50 also carries a 150 KB image
  (base64 in a data URL, as clients send them).
* HOURS of telemetry (default 24) from 5 nodes: every node reports its resources and peers
  every 5 s; free memory jitters by ~0.5% with a model load (10 GB) about once an hour, CPU
  load is noise.

"before" appends what the master used to log (every report, tasks with their request body)
to a plain `EventLog`, as before this change. "after" runs the same commands through the real
master path: `decide` (redaction, coalescing) and a `Replica` with its `SnapshotStore`
(snapshot every 10,000 events, the log cut behind it). Prints events, bytes on disk and the
time a restarted node takes to load the result; "peak" is the most the data directory held
during the run (the log just before a snapshot cut it). Never asserts on time.
"""

from __future__ import annotations

import base64
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from exo_core.bodies import without_body
from exo_core.commands import Command, ReportEvents, SubmitTask
from exo_core.decide import MasterContext, decide
from exo_core.eventlog import EventLog
from exo_core.events import (
    Event,
    IndexedEvent,
    InstanceCreated,
    NodeTelemetry,
    TaskCreated,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.generation import ChatMessage, ContentPart, GenerationParams
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.replica import Replica
from exo_core.snapshot import SnapshotStore
from exo_core.state import Instance, NodeResources, ShardAssignment, Task, TaskStatus

GB = 1 << 30
NODES = [NodeId(f"node-{i}") for i in range(5)]
MODEL = ModelId("Llama-3.2-3B-Instruct-4bit")
INSTANCE = Instance(
    instance_id=InstanceId("inst-1"),
    model_id=MODEL,
    sharding="pipeline",
    shards=(
        ShardAssignment(
            node_id=NODES[0],
            runner_id=RunnerId("inst-1-r0"),
            rank=0,
            world_size=1,
            start_layer=0,
            end_layer=28,
        ),
    ),
)
CTX = MasterContext(card=lambda _: None, place=lambda *_: [])


def words(rng: random.Random, chars: int) -> str:
    vocabulary = ["the", "cluster", "model", "answer", "please", "explain", "why", "token", "node"]
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(vocabulary))
    return " ".join(out)


def chat(rng: random.Random, i: int) -> GenerationParams:
    user: str | tuple[ContentPart, ...] = words(rng, 300)
    if i % 50 == 0:
        image = base64.b64encode(rng.randbytes(110_000)).decode()  # ~150 KB as base64
        user = (
            ContentPart(type="text", text=words(rng, 100)),
            ContentPart(type="image", image_url=f"data:image/jpeg;base64,{image}"),
        )
    return GenerationParams(
        messages=(
            ChatMessage(role="system", content=words(rng, 700)),
            ChatMessage(role="user", content=words(rng, 400)),
            ChatMessage(role="assistant", content=words(rng, 600)),
            ChatMessage(role="user", content=user),
        ),
        max_tokens=512,
    )


def chat_commands(n: int) -> Iterator[Command]:
    rng = random.Random(1)
    yield ReportEvents(events=(InstanceCreated(instance=INSTANCE),))
    for i in range(n):
        task = Task(
            task_id=TaskId(f"task-{i}"),
            instance_id=INSTANCE.instance_id,
            model_id=MODEL,
            origin_node=NODES[i % 5],
            params=chat(rng, i),
        )
        yield SubmitTask(task=task)
        for status in (TaskStatus.RUNNING, TaskStatus.COMPLETE):
            yield ReportEvents(events=(TaskStatusChanged(task_id=task.task_id, status=status),))


def telemetry_commands(hours: float) -> Iterator[Command]:
    rng = random.Random(2)
    free = {n: 40 * GB for n in NODES}
    disk = {n: 800 * GB for n in NODES}
    for step in range(int(hours * 3600 / 5)):
        for node in NODES:
            free[node] += int(rng.gauss(0, 0.005) * 64 * GB)
            if rng.random() < 1 / 720:  # a model loads or unloads, about once an hour
                free[node] += rng.choice([-10, 10]) * GB
            free[node] = min(60 * GB, max(4 * GB, free[node]))
            disk[node] -= rng.randrange(0, 2_000_000)
            resources = NodeResources(
                memory_total=64 * GB,
                memory_available=free[node],
                cpu_count=16,
                cpu_percent=rng.uniform(0, 100),
                disk_total=1000 * GB,
                disk_available=disk[node],
                os="Darwin 24.1.0",
                engines=("mlx",),
            )
            yield ReportEvents(
                events=(
                    NodeTelemetry(
                        node_id=node,
                        hostname=f"mac-{node}",
                        addresses=("192.168.1.10", "127.0.0.1"),
                        resources=resources,
                        timestamp=1.7e9 + step * 5.0,
                    ),
                    TopologyReported(node_id=node, peers=tuple(p for p in NODES if p != node)),
                )
            )


def before(commands: Iterator[Command], root: Path) -> tuple[int, int, int]:
    """What the master logged before: every reported event, every task with its body."""
    log = EventLog(root / "events.log", fsync=False)
    index = 0
    for command in commands:
        events: tuple[Event, ...] = ()
        if isinstance(command, SubmitTask):
            events = (TaskCreated(task=command.task),)
        elif isinstance(command, ReportEvents):
            events = command.events
        log.append(IndexedEvent(index=index + k, term=1, event=e) for k, e in enumerate(events))
        index += len(events)
    log.close()
    return index, _disk(root), _disk(root)  # it only grows: the end is the peak


def after(commands: Iterator[Command], root: Path) -> tuple[int, int, int]:
    """The real master path: decide, then a replica that snapshots and cuts its log."""
    replica = Replica(EventLog(root / "events.log", fsync=False), SnapshotStore(root / "snap"))
    peak = 0
    for count, command in enumerate(commands):
        if isinstance(command, SubmitTask):  # as the API node sends it
            command = SubmitTask(task=without_body(command.task))
        decision = decide(replica.state, command, CTX)
        start = replica.next_index
        indexed = [
            IndexedEvent(index=start + k, term=1, event=e) for k, e in enumerate(decision.events)
        ]
        replica.ingest(indexed, replica.term_at(start - 1))
        replica.mark_committed(replica.state.last_index)  # one node: a majority at once
        if count % 100 == 0:
            peak = max(peak, _disk(root))
    replica.log.close()
    return replica.next_index, _disk(root), max(peak, _disk(root))


def _disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.iterdir() if p.is_file())


def _load_time(root: Path) -> float:
    started = time.perf_counter()
    replica = Replica(EventLog(root / "events.log", fsync=False), SnapshotStore(root / "snap"))
    elapsed = time.perf_counter() - started
    replica.log.close()
    return elapsed


def main(requests: int, hours: float) -> None:
    workloads = [
        (f"{requests:,} chat requests", lambda: chat_commands(requests)),
        (f"{hours:g} h of telemetry, 5 nodes", lambda: telemetry_commands(hours)),
    ]
    print(f"{'workload':<34}{'':>8}{'events':>12}{'on disk':>12}{'peak':>12}{'restart':>10}")
    for name, commands in workloads:
        rows = []
        for label, write in (("before", before), ("after", after)):
            with tempfile.TemporaryDirectory() as tmp:
                events, size, peak = write(commands(), Path(tmp))
                load = _load_time(Path(tmp))
            rows.append((size, peak))
            print(
                f"{name:<34}{label:>8}{events:>12,}{size / 1e6:>10.2f}MB"
                f"{peak / 1e6:>10.2f}MB{load:>9.2f}s"
            )
        (size_before, peak_before), (size_after, peak_after) = rows
        print(
            f"{'':<34}{'ratio':>8}{'':>12}{size_before / max(1, size_after):>11.0f}x"
            f"{peak_before / max(1, peak_after):>11.0f}x"
        )


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 10_000,
        float(sys.argv[2]) if len(sys.argv) > 2 else 24.0,
    )
