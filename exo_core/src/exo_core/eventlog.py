"""The durable event log: one append-only file per node.

Each frame is `length (u32 LE) | crc32 of payload (u32 LE) | payload`, where the payload is one
msgpack-encoded `IndexedEvent`. A crash can only tear the last frame, since frames are only ever
appended: on open, the first frame that is short or fails its checksum ends the log, and the
file is cut back to the last whole frame.

`append` returns only after the frames are flushed and fsynced, so an event that was
acknowledged after `append` survives `kill -9` and power loss alike.

A log may start past index 0: `compact` cuts the events a snapshot holds (see
`exo_core.snapshot`), and the first frame's index is then the log's `first_index`.

A write or fsync that fails (a full disk, a file size limit, an I/O error) may have left part
of its frames in the file. `append` then cuts the file back to the last whole frame before it
raises `LogWriteFailed`, so the next append continues a clean log and the in-memory offsets
always match the file. When even that cut fails, the log refuses every later append (the torn
tail is dropped by the next open).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec
from loguru import logger

from exo_core.durable import (
    crash_point,
    crash_points_enabled,
    fsync_dir,
    replace_durably,
    write_all,
)
from exo_core.events import IndexedEvent

_HEADER = struct.Struct("<II")
MAX_FRAME = 64 * 1024 * 1024


class CorruptLog(RuntimeError):
    """The log's indices are not consecutive: not a torn tail, but a broken file."""


class LogWriteFailed(OSError):
    """An append did not reach the disk; its events are not in the log (nor acknowledged)."""


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
        # Unbuffered: a failed write leaves nothing behind in a buffer for the next to flush.
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        # Why appends are refused, once a failed append could not be cut back.
        self._unwritable: str | None = None

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
            fsync_dir(self.path.parent)  # the new file's name must survive a power loss too
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
        if self._unwritable is not None:
            raise LogWriteFailed(self._unwritable)
        crash_point("log-append", self.path)
        try:
            if crash_points_enabled():  # the simulation may crash us with a frame half written
                half = len(buffer) // 2
                write_all(self._fd, buffer[:half])
                crash_point("log-torn", self.path)
                write_all(self._fd, buffer[half:])
            else:
                write_all(self._fd, buffer)
            crash_point("log-written", self.path)
            if self._fsync:
                os.fsync(self._fd)
        except OSError as e:
            self._cut_back(e)
            raise LogWriteFailed(
                f"event log {self.path}: appending events {self.next_index}..{expected - 1} "
                f"failed ({e}); they are not in the log"
            ) from e
        self._end += len(buffer)
        self._offsets.extend(new_offsets)

    def _cut_back(self, error: OSError) -> None:
        """Drop whatever a failed append left after the last whole frame."""
        try:
            os.ftruncate(self._fd, self._end)
            if self._fsync:
                os.fsync(self._fd)
        except OSError as again:
            self._unwritable = (
                f"event log {self.path}: an append failed ({error}) and its partial frame "
                f"could not be cut off ({again}); no more events are accepted. Free disk "
                "space and restart exo (the torn frame is dropped on open)"
            )
            logger.critical(self._unwritable)
        else:
            logger.error(f"event log {self.path}: an append failed ({error}); cut back")

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
        end = self._offsets[next_index - self._first]
        os.ftruncate(self._fd, end)
        os.fsync(self._fd)
        self._end = end
        del self._offsets[next_index - self._first :]

    def clear(self, first_index: int = 0) -> None:
        """Drop every event; the log continues at `first_index` (a snapshot replaced it)."""
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
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
        replace_durably(self.path, tail)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._offsets = [o - cut for o in self._offsets[keep:]]
        self._end -= cut
        self._first = first_index

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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
