"""The durable event log: round trips, torn tails, and kill -9 in the middle of appends."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loguru import logger

from exo_core.eventlog import EventLog
from exo_core.reducer import replay
from exo_core.testing.logwriter import event_at


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "events.log"
    log = EventLog(path)
    log.append(event_at(i) for i in range(10))
    log.append([event_at(10)])
    assert [e.index for e in log.read(3, 6)] == [3, 4, 5]
    log.close()
    again = EventLog(path)
    assert again.next_index == 11
    assert list(again) == [event_at(i) for i in range(11)]


def test_append_refuses_a_gap(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.log")
    log.append([event_at(0)])
    with pytest.raises(ValueError):
        log.append([event_at(2)])


@pytest.mark.parametrize("damage", ["half_header", "half_payload", "bad_checksum"])
def test_torn_tail_is_dropped_and_logged(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "events.log"
    log = EventLog(path)
    log.append(event_at(i) for i in range(5))
    log.close()
    whole = path.stat().st_size
    with open(path, "r+b") as f:
        data = f.read()
        if damage == "half_header":
            f.seek(0, 2)
            f.write(b"\x05\x00")
        elif damage == "half_payload":
            f.truncate(whole - 3)
        else:
            f.seek(whole - 1)
            f.write(bytes([data[-1] ^ 0xFF]))
    messages: list[str] = []
    sink = logger.add(messages.append, level="WARNING")
    try:
        reopened = EventLog(path)
    finally:
        logger.remove(sink)
    expected = 5 if damage == "half_header" else 4
    assert reopened.next_index == expected
    assert any("torn tail" in m for m in messages)
    # Appending after recovery continues the log cleanly.
    reopened.append([event_at(expected)])
    reopened.close()
    assert EventLog(path).next_index == expected + 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_mid_write_loses_nothing_acknowledged(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "events.log"
    acked = -1
    for _round in range(3):
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exo_core.testing.logwriter",
                str(path),
                str(rng.randint(1, 50)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        deadline = time.monotonic() + rng.uniform(0.2, 0.8)
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked = max(acked, int(line))
        child.send_signal(signal.SIGKILL)
        # Acknowledgements printed before the kill still count.
        for line in child.stdout.read().splitlines():
            acked = max(acked, int(line))
        child.wait()
        log = EventLog(path)
        assert log.next_index - 1 >= acked, "an acknowledged event was lost"
        events = list(log)
        assert events == [event_at(i) for i in range(log.next_index)]
        assert replay(events) == replay([event_at(i) for i in range(log.next_index)])
        log.close()
    assert acked > 0


def test_large_log_replays(tmp_path: Path) -> None:
    """100,000 events write and replay (the time is printed by bench/bench_eventlog.py)."""
    log = EventLog(tmp_path / "events.log", fsync=False)
    for start in range(0, 100_000, 10_000):
        log.append(event_at(i) for i in range(start, start + 10_000))
    log.close()
    state = replay(list(EventLog(tmp_path / "events.log")))
    assert state.last_index == 99_999
