"""How fast the durable event log writes and replays.

    uv run python bench/bench_eventlog.py [N]

Prints append throughput (batched, fsync per batch and per event), raw read time and full replay
(read + reducer) time for N events (default 100,000), then the start-up of a node whose replica
wrote the same events with snapshots (every 10,000 events, the log cut behind each): it loads
the snapshot and replays the tail (~10,000 events, the most it can be). Never asserts on time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from exo_core.eventlog import EventLog
from exo_core.reducer import replay
from exo_core.replica import Replica
from exo_core.snapshot import SnapshotStore
from exo_core.testing.logwriter import event_at


def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.log"
        log = EventLog(path)
        started = time.perf_counter()
        for start in range(0, n, 1000):
            log.append(event_at(i) for i in range(start, min(n, start + 1000)))
        batched = time.perf_counter() - started
        log.close()
        size = path.stat().st_size

        single = EventLog(Path(tmp) / "single.log")
        k = 500
        started = time.perf_counter()
        for i in range(k):
            single.append([event_at(i)])
        per_event = (time.perf_counter() - started) / k
        single.close()

        started = time.perf_counter()
        reopened = EventLog(path)
        opened = time.perf_counter() - started
        started = time.perf_counter()
        events = list(reopened)
        read = time.perf_counter() - started
        started = time.perf_counter()
        state = replay(events)
        applied = time.perf_counter() - started
        assert state.last_index == n - 1

        snapped = Path(tmp) / "snapped"
        writer = Replica(EventLog(snapped / "events.log"), SnapshotStore(snapped / "snapshot"))
        for start in range(0, n, 1000):
            batch = [event_at(i) for i in range(start, min(n, start + 1000))]
            writer.ingest(batch, writer.term_at(start - 1))
            # The commit index lags by 9,000 events, so the last snapshot is ~10,000 events
            # behind the end: the longest tail a restart replays.
            writer.mark_committed(writer.state.last_index - 9_000)
        writer.log.close()
        started = time.perf_counter()
        restarted = Replica(EventLog(snapped / "events.log"), SnapshotStore(snapped / "snapshot"))
        restart = time.perf_counter() - started
        assert restarted.state == state
        tail = restarted.next_index - restarted.first_index
        on_disk = sum(p.stat().st_size for p in snapped.iterdir())

    print(f"events                     {n:>10,}")
    print(f"log size                   {size / 1e6:>10.1f} MB")
    print(f"append, fsync per 1000     {n / batched:>10,.0f} events/s")
    print(
        f"append, fsync per event    {1 / per_event:>10,.0f} events/s ({per_event * 1e3:.2f} ms each)"
    )
    print(f"open + recover             {opened:>10.2f} s")
    print(f"read all frames            {read:>10.2f} s")
    print(f"reduce into state          {applied:>10.2f} s")
    print(f"replay total               {opened + read + applied:>10.2f} s")
    print(f"with snapshots: on disk    {on_disk / 1e6:>10.1f} MB (a {tail:,}-event tail)")
    print(f"restart: snapshot + tail   {restart:>10.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
