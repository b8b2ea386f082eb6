"""The data plane on the receiving side: a stream per task whose caller is on this node."""

from __future__ import annotations

import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from exo_core.generation import Chunk, ErrorChunk
from exo_core.ids import InstanceId, TaskId


class ChunkRouter:
    def __init__(self) -> None:
        self._streams: dict[TaskId, MemoryObjectSendStream[Chunk]] = {}
        self._instances: dict[TaskId, InstanceId] = {}

    def open(self, task_id: TaskId, instance_id: InstanceId) -> MemoryObjectReceiveStream[Chunk]:
        # Unbounded: a slow client must never stall the runner that feeds many clients.
        send, receive = anyio.create_memory_object_stream[Chunk](math.inf)
        self._streams[task_id] = send
        self._instances[task_id] = instance_id
        return receive

    def instance_of(self, task_id: TaskId) -> InstanceId | None:
        """The instance whose rank 0 answers `task_id`, while a caller here waits for it."""
        return self._instances.get(task_id)

    def tasks_of(self, instance_id: str) -> list[TaskId]:
        return [t for t, i in self._instances.items() if i == instance_id]

    def close(self, task_id: TaskId) -> None:
        self._instances.pop(task_id, None)
        stream = self._streams.pop(task_id, None)
        if stream is not None:
            stream.close()

    def deliver(self, chunk: Chunk) -> bool:
        """Hand a chunk to its waiting caller; False when nobody waits for it any more."""
        stream = self._streams.get(chunk.task_id)
        if stream is None:
            return False
        try:
            stream.send_nowait(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._streams.pop(chunk.task_id, None)
            return False
        return True

    def fail(self, task_id: TaskId, message: str) -> None:
        self.deliver(ErrorChunk(task_id=task_id, message=message))

    def waiting(self) -> frozenset[TaskId]:
        return frozenset(self._streams)
