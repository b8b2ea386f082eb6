"""Snapshots of the replicated state, so the event log can be cut behind them.

A snapshot is the state after event `state.last_index` together with the term history up to
there. A node writes one only of events it knows to be committed (held by a majority), since
those are never cut from a log again. The file is written beside the log: a temporary file,
fsynced, renamed over the old one, then the directory fsynced, so a crash leaves either the
old snapshot or the new one, whole. Layout: `magic | crc32 of payload (u32 LE) | payload`,
the payload one msgpack-encoded `Snapshot`.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import msgspec

from exo_core.durable import fsync_dir, replace_durably
from exo_core.state import State
from exo_core.term_history import TermHistory, TermRun

_MAGIC = b"EXOSNAP1"
_CRC = struct.Struct("<I")


class CorruptSnapshot(RuntimeError):
    """The snapshot file exists but cannot be read back: the disk lost data."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    state: State
    terms: tuple[TermRun, ...]

    @property
    def last_index(self) -> int:
        return self.state.last_index

    @property
    def next_index(self) -> int:
        return self.state.last_index + 1

    def history(self) -> TermHistory:
        return TermHistory(self.terms, self.next_index)

    @property
    def last_term(self) -> int:
        return self.history().last_term


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Snapshot).decode


def encode_snapshot(snapshot: Snapshot) -> bytes:
    payload = _encode(snapshot)
    return _MAGIC + _CRC.pack(zlib.crc32(payload)) + payload


def decode_snapshot(data: bytes, where: str = "snapshot") -> Snapshot:
    head = len(_MAGIC) + _CRC.size
    if len(data) < head or not data.startswith(_MAGIC):
        raise CorruptSnapshot(f"{where}: not an exo snapshot")
    (crc,) = _CRC.unpack_from(data, len(_MAGIC))
    payload = data[head:]
    if zlib.crc32(payload) != crc:
        raise CorruptSnapshot(f"{where}: checksum mismatch")
    try:
        return _decode(payload)
    except msgspec.DecodeError as e:
        raise CorruptSnapshot(f"{where}: {e}") from e


class SnapshotStore:
    """The one snapshot file of a node."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Snapshot | None:
        if not self.path.exists():
            return None
        return decode_snapshot(self.path.read_bytes(), str(self.path))

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)

    def save(self, snapshot: Snapshot) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(self.path, encode_snapshot(snapshot))
