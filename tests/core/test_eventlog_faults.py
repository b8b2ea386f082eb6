"""The event log when the disk fails: every failed append is cut back, nothing acknowledged is lost.

Faults are injected, not produced by filling a real disk: a disk that runs full after exactly
`budget` bytes (every byte offset of the run, so at every append point and inside every frame),
an fsync that fails at each call in turn, a failure of the cut-back itself, and, in a child
process, a real file size limit (RLIMIT_FSIZE), as the issue's reproduction used.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exo_core.eventlog import EventLog, LogWriteFailed
from exo_core.events import IndexedEvent
from exo_core.testing.harness import running_node
from exo_core.testing.logwriter import event_at
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

BATCHES = [1, 3, 1, 2, 1, 1, 4, 1]  # events per append
EVENTS = sum(BATCHES)


class Disk:
    """Wraps os.write / os.fsync / os.ftruncate for one file: it fills up after `budget`
    bytes and fails the fsync numbered `failing_fsync`; other files are untouched."""

    def __init__(
        self,
        path: Path,
        budget: int | None = None,
        failing_fsync: int | None = None,
        cut_fails: bool = False,
    ) -> None:
        self.path = str(path)
        self.budget = budget
        self.failing_fsync = failing_fsync
        self.cut_fails = cut_fails
        self.fsyncs = 0
        self._write, self._fsync, self._ftruncate = os.write, os.fsync, os.ftruncate

    def _ours(self, fd: int) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == self.path
        except OSError:
            return False

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if not self._ours(fd) or self.budget is None:
            return self._write(fd, data)
        room = self.budget - os.fstat(fd).st_size
        if room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return self._write(fd, bytes(data[:room]))  # a short write, as a filling disk gives

    def fsync(self, fd: int) -> None:
        if self._ours(fd):
            self.fsyncs += 1
            if self.fsyncs == self.failing_fsync:
                raise OSError(errno.EIO, "Input/output error (injected)")
        self._fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        if self._ours(fd) and self.cut_fails:
            raise OSError(errno.EIO, "Input/output error (injected)")
        self._ftruncate(fd, length)

    def free(self) -> None:
        self.budget = self.failing_fsync = None
        self.cut_fails = False


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    d = Disk(tmp_path / "events.log")
    monkeypatch.setattr(os, "write", d.write)
    monkeypatch.setattr(os, "fsync", d.fsync)
    monkeypatch.setattr(os, "ftruncate", d.ftruncate)
    yield d


def run_appends(log: EventLog, disk: Disk) -> list[IndexedEvent]:
    """Append every batch; a batch that fails is retried once the disk has room again.
    Returns what was acknowledged; checks after each failure that the log is still whole."""
    acknowledged: list[IndexedEvent] = []
    failures = 0
    for size in BATCHES:
        batch = [event_at(i) for i in range(len(acknowledged), len(acknowledged) + size)]
        try:
            log.append(batch)
        except LogWriteFailed:
            failures += 1
            assert log.next_index == len(acknowledged)
            assert log.read() == acknowledged, "the in-memory offsets disagree with the file"
            disk.free()
            log.append(batch)  # the next append continues a clean log
        acknowledged.extend(batch)
    return acknowledged


def reopened(path: Path) -> list[IndexedEvent]:
    log = EventLog(path)
    try:
        return list(log)
    finally:
        log.close()


def budgets(tmp_path: Path) -> list[int]:
    """Disk sizes to fail at: each append point, and bytes inside the header and the payload
    of each append's first frame, plus every 7th byte of the whole run."""
    probe = EventLog(tmp_path / "probe.log", fsync=False)
    ends, done = [0], 0
    for size in BATCHES:
        probe.append(event_at(i) for i in range(done, done + size))
        done += size
        ends.append((tmp_path / "probe.log").stat().st_size)
    probe.close()
    inside = [end + d for end in ends[:-1] for d in (1, 4, 7, 8, 9, 20)]
    return sorted({*ends, *inside, *range(0, ends[-1], 7)})


def test_a_full_disk_at_every_append_point_loses_nothing_acknowledged(
    tmp_path: Path, disk: Disk
) -> None:
    path = tmp_path / "events.log"
    for budget in budgets(tmp_path):
        path.unlink(missing_ok=True)
        disk.budget = budget
        # Without fsync (the fsync faults have their own test), so the many runs stay fast.
        log = EventLog(path, fsync=False)
        acknowledged = run_appends(log, disk)
        log.close()
        assert reopened(path) == acknowledged == [event_at(i) for i in range(EVENTS)], budget


def test_a_failed_fsync_at_every_append_loses_nothing_acknowledged(
    tmp_path: Path, disk: Disk
) -> None:
    path = tmp_path / "events.log"
    for failing in range(1, len(BATCHES) + 1):
        path.unlink(missing_ok=True)
        disk.fsyncs, disk.failing_fsync = 0, failing
        log = EventLog(path)
        acknowledged = run_appends(log, disk)
        log.close()
        assert reopened(path) == acknowledged, failing


def test_a_failed_cut_back_refuses_further_appends(tmp_path: Path, disk: Disk) -> None:
    path = tmp_path / "events.log"
    log = EventLog(path)
    log.append([event_at(0), event_at(1)])
    disk.budget = path.stat().st_size + 5  # the next frame tears after 5 bytes
    disk.cut_fails = True
    with pytest.raises(LogWriteFailed):
        log.append([event_at(2)])
    disk.free()
    with pytest.raises(LogWriteFailed, match="no more events are accepted"):
        log.append([event_at(2)])
    log.close()
    # The torn frame is dropped on open; what was acknowledged is all there.
    assert reopened(path) == [event_at(0), event_at(1)]
    again = EventLog(path)
    again.append([event_at(2)])
    again.close()
    assert reopened(path) == [event_at(i) for i in range(3)]


CHILD = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from exo_core.eventlog import EventLog, LogWriteFailed
    from exo_core.testing.logwriter import event_at

    path, limit = Path(sys.argv[1]), int(sys.argv[2])
    log = EventLog(path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    index, failed = 0, 0
    while index < 60:
        try:
            log.append([event_at(index), event_at(index + 1)])
        except LogWriteFailed:
            failed += 1
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            continue
        index += 2
        print(index - 1, flush=True)
    print("failed", failed, flush=True)
    """
)


@pytest.mark.parametrize("limit", [600, 1111])
def test_a_file_size_limit_in_a_real_process(tmp_path: Path, limit: int) -> None:
    path = tmp_path / "events.log"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    lines = child.stdout.split()
    assert lines[-2:] == ["failed", "1"], child.stdout
    assert reopened(path) == [event_at(i) for i in range(60)]


def test_a_node_with_a_full_disk_refuses_commands_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master answers 507 while the disk is full, keeps serving, and continues the log
    cleanly once there is room; the log reopens whole."""
    data = tmp_path / "node"
    disk = Disk(data / "events.log")
    monkeypatch.setattr(os, "write", disk.write)
    with running_node(data, [ScriptedEnginePlugin()]) as node:
        disk.budget = (data / "events.log").stat().st_size + 10  # full within the next frame
        body = {"model_id": "scripted-echo"}
        full = httpx.post(f"{node.url}/instance", json=body, timeout=30)
        assert full.status_code == 507, full.text
        assert "not in the log" in full.json()["detail"]
        assert httpx.get(f"{node.url}/healthz", timeout=5).status_code == 200
        disk.free()
        placed = httpx.post(f"{node.url}/instance", json=body, timeout=30)
        assert placed.status_code == 201, placed.text
        held = node.node.replica.next_index
    log = EventLog(data / "events.log")
    assert log.next_index >= held
    assert [e.index for e in log] == list(range(log.next_index))
    log.close()
