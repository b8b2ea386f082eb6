"""Messages between the worker (parent) and an image runner subprocess, as msgpack frames."""

from __future__ import annotations

import msgspec

from exo_core.engine import RunnerSpec
from exo_core.generation import Chunk
from exo_core.ids import TaskId
from exo_core.images import ImageRequest
from exo_core.state import RunnerStatus


class Submit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    task_id: TaskId
    request: ImageRequest


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    task_id: TaskId


class Shutdown(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class StatusUpdate(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    status: RunnerStatus
    error: str | None = None


class ChunkOut(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    chunk: Chunk


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    spec: RunnerSpec
    # A short generation before READY, so the first request pays no first-call costs.
    warmup: bool = True


ToRunner = Submit | Cancel | Shutdown
FromRunner = StatusUpdate | ChunkOut

encode = msgspec.msgpack.Encoder().encode
decode_to_runner = msgspec.msgpack.Decoder(ToRunner).decode
decode_from_runner = msgspec.msgpack.Decoder(FromRunner).decode
decode_launch = msgspec.msgpack.Decoder(Launch).decode
