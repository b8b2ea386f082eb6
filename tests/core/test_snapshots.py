"""Snapshots and log compaction: a node restarted from a snapshot plus the log's tail holds what
one that replayed the whole log holds, whatever the events and wherever the cuts fall."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo_core.eventlog import EventLog
from exo_core.events import Event, IndexedEvent
from exo_core.reducer import replay
from exo_core.replica import Replica
from exo_core.snapshot import Snapshot, SnapshotStore
from exo_core.testing.logwriter import event_at
from exo_core.testing.strategies import events

TERMS = st.integers(min_value=1, max_value=3)


def open_replica(root: Path, every: int) -> Replica:
    log = EventLog(root / "events.log", fsync=False)
    return Replica(log, SnapshotStore(root / "snapshot.bin"), snapshot_every=every)


def indexed(steps: list[tuple[Event, int]]) -> list[IndexedEvent]:
    """Events with consecutive indices and non-decreasing terms."""
    out, term = [], 1
    for i, (event, bump) in enumerate(steps):
        term += bump
        out.append(IndexedEvent(index=i, term=term, event=event))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(events, st.integers(0, 1)), min_size=1, max_size=60),
    every=st.integers(1, 12),
    batch=st.integers(1, 7),
    commit_lag=st.integers(0, 5),
)
def test_restart_from_snapshot_and_tail_equals_full_replay(
    steps: list[tuple[Event, int]], every: int, batch: int, commit_lag: int
) -> None:
    log = indexed(steps)
    expected = replay(log)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        replica = open_replica(root, every)
        for start in range(0, len(log), batch):
            chunk = log[start : start + batch]
            replica.ingest(chunk, replica.term_at(start - 1))
            # Followers learn the commit index late: only what lags behind is committed.
            replica.mark_committed(chunk[-1].index - commit_lag)
        assert replica.state == expected
        committed = max(-1, len(log) - 1 - commit_lag)
        # The first snapshot is of the state after the first batch that reaches `every` events.
        ends = [min(s + batch, len(log)) - 1 for s in range(0, len(log), batch)]
        first = next((end for end in ends if end + 1 >= every), None)
        if first is not None and first <= committed:
            assert replica.snapshot is not None and replica.first_index > 0, "nothing was cut"
        assert replica.first_index <= committed + 1, "an uncommitted event left the log"
        replica.log.close()

        restarted = open_replica(root, every)
        assert restarted.state == expected
        assert restarted.next_index == len(log)
        assert [restarted.term_at(e.index) for e in log] == [e.term for e in log]
        assert list(restarted.log) == log[restarted.first_index :]
        restarted.log.close()


def test_a_crash_between_snapshot_and_cut_loses_nothing(tmp_path: Path) -> None:
    log = [event_at(i) for i in range(30)]
    replica = open_replica(tmp_path, every=1000)
    replica.ingest(log[:20], 0)
    # The snapshot is written, then the process dies before the log is cut behind it.
    replica.snapshots.save(Snapshot(state=replay(log[:12]), terms=((0, 1),)))
    replica.log.close()
    restarted = open_replica(tmp_path, every=1000)
    assert restarted.first_index == 12
    assert restarted.state == replay(log[:20])
    restarted.ingest(log[20:], 1)
    assert restarted.state == replay(log)


def test_compacted_log_reads_appends_and_reopens(tmp_path: Path) -> None:
    path = tmp_path / "events.log"
    log = EventLog(path)
    log.append(event_at(i) for i in range(10))
    log.compact(6)
    assert (log.first_index, log.next_index) == (6, 10)
    assert [e.index for e in log.read(0, 8)] == [6, 7]
    log.append([event_at(10)])
    log.truncate(9)
    log.close()
    again = EventLog(path)
    assert (again.first_index, again.next_index) == (6, 9)
    assert list(again) == [event_at(i) for i in range(6, 9)]
    again.compact(20)  # past the end: empty, continuing at 20
    assert (again.first_index, again.next_index) == (20, 20)


def test_a_diverged_snapshot_is_dropped_and_the_log_starts_over(tmp_path: Path) -> None:
    replica = open_replica(tmp_path, every=5)
    replica.ingest([event_at(i) for i in range(12)], 0)
    replica.mark_committed(11)
    assert replica.first_index > 0
    # Another cluster's master says even our committed events are not its own.
    replica.truncate(replica.divergence_point())
    assert replica.next_index == 0 and replica.snapshot is None
    assert not replica.snapshots.path.exists()
