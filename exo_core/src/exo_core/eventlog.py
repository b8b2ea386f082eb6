"""The durable event log: one append-only file per node.

Each frame is `length (u32 LE) | crc32 of payload (u32 LE) | payload`, where the payload is one
msgpack-encoded `IndexedEvent`. A crash can only tear the last frame, since frames are only ever
appended: on open, the first frame that is short or fails its checksum ends the log, and the
file is cut back to the last whole frame.

`append` returns only after the frames are flushed and fsynced, so an event that was
acknowledged after `append` survives `kill -9` and power loss alike.

A log may start past index 0: `compact` cuts the events a snapshot holds (see
`exo_core.snapshot`), and the first frame's index is then the log's `first_index`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
from loguru import logger

from exo_core.events import IndexedEvent

_HEADER = struct.Struct("<II")
MAX_FRAME = 64 * 1024 * 1024


class CorruptLog(RuntimeError):
    """The log's indices are not consecutive: not a torn tail, but a broken file."""


class EventLog:
    """Appends and reads indexed events. Indices must be consecutive from 0."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(IndexedEvent)
        self._offsets: list[int] = []  # byte offset of the frame of each index from `_first`
        self._first = 0  # index of the first frame in the file (after compaction)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._end = self._recover()
        self._file = open(path, "ab")  # noqa: SIM115 (kept open for the log's lifetime)

    @property
    def next_index(self) -> int:
        return self._first + len(self._offsets)

    @property
    def first_index(self) -> int:
        """The index of the first event still in the log (earlier ones are in a snapshot)."""
        return self._first

    def _recover(self) -> int:
        """Index the frames on disk and cut off a torn tail. Returns the end offset."""
        if not self.path.exists():
            self.path.touch()
            return 0
        end = 0
        with open(self.path, "rb") as f:
            data = f.read()
        for offset, frame in _frames(data):
            if frame is None:
                break
            event = self._decoder.decode(frame)
            if offset == 0:
                self._first = event.index
            if event.index != self.next_index:
                raise CorruptLog(
                    f"{self.path}: frame at byte {offset} has index {event.index}, "
                    f"expected {self.next_index}"
                )
            self._offsets.append(offset)
            end = offset + _HEADER.size + len(frame)
        if end < len(data):
            logger.warning(
                f"event log {self.path}: dropped a torn tail of {len(data) - end} bytes "
                f"after event {self.next_index - 1}"
            )
            with open(self.path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        return end

    def append(self, events: Iterable[IndexedEvent]) -> None:
        """Write events durably. Their indices must continue the log."""
        buffer = bytearray()
        offset = self._end
        new_offsets: list[int] = []
        expected = self.next_index
        for event in events:
            if event.index != expected:
                raise ValueError(f"append of index {event.index}, expected {expected}")
            payload = self._encoder.encode(event)
            new_offsets.append(offset + len(buffer))
            buffer += _HEADER.pack(len(payload), zlib.crc32(payload))
            buffer += payload
            expected += 1
        if not buffer:
            return
        self._file.write(buffer)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._end += len(buffer)
        self._offsets.extend(new_offsets)

    def read(self, start: int = 0, stop: int | None = None) -> list[IndexedEvent]:
        """Events with `start <= index < stop`."""
        start = max(start, self._first)
        stop = self.next_index if stop is None else min(stop, self.next_index)
        if start >= stop:
            return []
        begin = self._offsets[start - self._first]
        end = self._offsets[stop - self._first] if stop < self.next_index else self._end
        with open(self.path, "rb") as f:
            f.seek(begin)
            data = f.read(end - begin)
        return [self._decoder.decode(frame) for _, frame in _frames(data) if frame is not None]

    def __iter__(self) -> Iterator[IndexedEvent]:
        batch = 10_000
        for start in range(self._first, self.next_index, batch):
            yield from self.read(start, start + batch)

    def truncate(self, next_index: int) -> None:
        """Drop every event from `next_index` on (a follower whose tail the master replaced)."""
        if next_index >= self.next_index:
            return
        if next_index < self._first:
            raise ValueError(f"cannot cut at {next_index}: the log starts at {self._first}")
        self._end = self._offsets[next_index - self._first]
        del self._offsets[next_index - self._first :]
        self._file.truncate(self._end)
        self._file.flush()
        os.fsync(self._file.fileno())

    def clear(self, first_index: int = 0) -> None:
        """Drop every event; the log continues at `first_index` (a snapshot replaced it)."""
        self._file.truncate(0)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._offsets = []
        self._end = 0
        self._first = first_index

    def compact(self, first_index: int) -> None:
        """Drop every event before `first_index` (a snapshot holds them): the tail is copied to
        a new file that replaces the log by rename. Past the end, the log becomes empty and
        continues at `first_index`."""
        if first_index <= self._first:
            return
        keep = first_index - self._first
        cut = self._offsets[keep] if keep < len(self._offsets) else self._end
        with open(self.path, "rb") as f:
            f.seek(cut)
            tail = f.read(self._end - cut)
        tmp = self.path.with_name(self.path.name + ".compact")
        with open(tmp, "wb") as f:
            f.write(tail)
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._file = open(self.path, "ab")  # noqa: SIM115 (kept open for the log's lifetime)
        self._offsets = [o - cut for o in self._offsets[keep:]]
        self._end -= cut
        self._first = first_index

    def close(self) -> None:
        self._file.close()


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in the directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _frames(data: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(offset, payload) for each whole frame; (offset, None) for a torn or corrupt one, then stop."""
    offset = 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            yield offset, None
            return
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        payload = data[start : start + length]
        if length > MAX_FRAME or len(payload) < length or zlib.crc32(payload) != crc:
            yield offset, None
            return
        yield offset, bytes(payload)
        offset = start + length
