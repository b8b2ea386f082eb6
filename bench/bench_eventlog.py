"""How fast the durable event log writes and replays.

    uv run python bench/bench_eventlog.py [N]

Prints append throughput (batched, fsync per batch and per event), raw read time and full replay
(read + reducer) time for N events (default 100,000). Never asserts on time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from exo_core.eventlog import EventLog
from exo_core.reducer import replay
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


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
