"""Telemetry does not grow the log without bound: reports that change nothing the cluster
decides with are not logged, and snapshots cut the superseded ones that were."""

from __future__ import annotations

from pathlib import Path

import httpx

from exo_core.coalesce import REFRESH_S
from exo_core.commands import ReportEvents
from exo_core.decide import news
from exo_core.events import (
    DownloadProgressed,
    Event,
    IndexedEvent,
    NodeTelemetry,
    TopologyReported,
)
from exo_core.ids import ModelId, NodeId, RunnerId
from exo_core.reducer import apply
from exo_core.state import DownloadProgress, DownloadStatus, NodeResources, State
from exo_core.testing.harness import running_node

GB = 1 << 30
NODE = NodeId("n1")


def telemetry(t: float, free: int, cpu: float = 10.0, node: NodeId = NODE) -> NodeTelemetry:
    resources = NodeResources(memory_total=64 * GB, memory_available=free, cpu_percent=cpu)
    return NodeTelemetry(node_id=node, hostname="h", resources=resources, timestamp=t)


def after(state: State, event: Event) -> State:
    return apply(state, IndexedEvent(index=state.last_index + 1, term=1, event=event))


def logged_over(state: State, reports: list[NodeTelemetry]) -> int:
    """How many of `reports` the master logs, sent one at a time."""
    count = 0
    for report in reports:
        for event in news(state, [report]):
            state = after(state, event)
            count += 1
    return count


def test_an_hour_of_steady_telemetry_logs_about_once_a_minute() -> None:
    # Every 5 s, with CPU noise and free memory jittering by less than a 2% step.
    reports = [
        telemetry(t=5.0 * i, free=32 * GB + (i % 7) * 50_000_000, cpu=(i * 37) % 100)
        for i in range(720)
    ]
    logged = logged_over(State(), reports)
    assert logged <= 3600 / REFRESH_S + 1
    assert logged >= 3600 / REFRESH_S - 1  # last_seen stays fresh


def test_what_changes_decisions_is_logged_at_once() -> None:
    state = State()
    for event in news(state, [telemetry(0.0, 32 * GB), TopologyReported(node_id=NODE, peers=())]):
        state = after(state, event)
    assert news(state, [telemetry(5.0, 20 * GB)]), "a drop of free memory is news"
    assert not news(state, [TopologyReported(node_id=NODE, peers=())])
    assert news(state, [TopologyReported(node_id=NODE, peers=(NodeId("n2"),))])
    # A runner process that starts is news (exo ps shows its memory); its jitter is not.
    loaded = telemetry(10.0, 32 * GB)
    loaded.resources.runner_memory[RunnerId("r")] = 2 * GB
    assert news(state, [loaded])
    state = after(state, loaded)
    jitter = telemetry(15.0, 32 * GB)
    jitter.resources.runner_memory[RunnerId("r")] = 2 * GB + 10_000_000
    assert not news(state, [jitter])

    def progress(done: int, status: DownloadStatus = DownloadStatus.ONGOING) -> DownloadProgressed:
        return DownloadProgressed(
            progress=DownloadProgress(
                node_id=NODE,
                model_id=ModelId("m"),
                status=status,
                downloaded_bytes=done,
                total_bytes=1000 * 100,
            )
        )

    state = after(state, progress(0))
    assert not news(state, [progress(500)]), "half a percent is not a step"
    assert news(state, [progress(1000)])
    assert news(state, [progress(500, DownloadStatus.FAILED)])
    # Within one report, each event is judged after the ones before it.
    assert len(news(state, [progress(1000), progress(1200), progress(2000)])) == 2


def test_the_log_file_stays_bounded_under_changing_telemetry(tmp_path: Path) -> None:
    with running_node(tmp_path, api=False, worker=False, snapshot_every=100) as node:
        sizes = []
        for round_ in range(3):
            for i in range(150):
                # Free memory swings every time: every report is news and gets logged. (The
                # node reports as itself: another node id would be a member to wait for.)
                free = (i % 2 + 1) * 16 * GB
                me = node.node.node_id
                report = ReportEvents(events=(telemetry(1e6 * round_ + i, free, node=me),))
                assert node.call(node.node.send_command, report).ok
            sizes.append((tmp_path / "events.log").stat().st_size)
        replica = node.node.replica
        assert replica.next_index > 450
        assert replica.first_index > 300, "the log was not cut behind snapshots"
        assert replica.next_index - replica.first_index < 250
        assert max(sizes) < 250 * 400, f"log sizes {sizes}"


def test_events_from_before_the_cut_start_with_the_snapshot(tmp_path: Path) -> None:
    with running_node(tmp_path, worker=False, snapshot_every=20) as node:
        me = node.node.node_id
        for i in range(60):
            report = ReportEvents(events=(telemetry(1e6 + i, (i % 2 + 1) * 16 * GB, node=me),))
            assert node.call(node.node.send_command, report).ok
        replica = node.node.replica
        assert replica.snapshot is not None
        last = replica.state.last_index
        kinds: list[str] = []
        ids: list[int] = []
        with httpx.stream("GET", f"{node.url}/events", params={"since": 0}, timeout=10) as r:
            for line in r.iter_lines():
                if line.startswith("event:"):
                    kinds.append(line[6:].strip())
                if line.startswith("id:"):
                    ids.append(int(line[3:].strip()))
                    if ids[-1] >= last:
                        break
        assert kinds[0] == "snapshot" and set(kinds[1:]) == {"event"}
        assert ids == list(range(ids[0], ids[0] + len(ids))), "no event is missing or repeated"
