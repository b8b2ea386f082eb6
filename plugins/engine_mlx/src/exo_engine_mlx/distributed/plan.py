"""The step plan: rank 0 tells every rank which tasks join and leave the batch before a step.

Each rank's worker hands its runner the tasks at its own pace, so the ranks cannot decide batch
composition alone. Rank 0 decides and broadcasts a plan before every step; every rank applies
it, then steps, so all batch generators hold the same sequences in the same order. A join
carries the task's parameters (with a seed filled in for random sampling, so every rank draws
the same tokens): a rank never waits for its own worker to deliver them.
"""

from __future__ import annotations

import struct

import mlx.core as mx
import msgspec
import numpy as np
from mlx_lm.generate import generation_stream

from exo_core.plugin import GenerationParams, TaskId

# The first exchange of every step carries up to this many bytes; longer plans take a second.
HEAD_BYTES = 1024
_LEN = struct.Struct("<I")


class Join(msgspec.Struct, frozen=True, kw_only=True):
    task_id: TaskId
    params: GenerationParams


class StepPlan(msgspec.Struct, frozen=True, kw_only=True):
    joins: tuple[Join, ...] = ()
    cancels: tuple[TaskId, ...] = ()
    # Rank 0's batch fingerprint after the previous step: a rank that disagrees has diverged.
    fingerprint: int = 0
    # The group ends after this plan (rank 0 was told to stop).
    stop: bool = False

    @property
    def empty(self) -> bool:
        return not (self.joins or self.cancels or self.stop)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(StepPlan).decode


def _all_sum_bytes(data: bytes, size: int, group: mx.distributed.Group) -> bytes:
    buffer = np.zeros(size, dtype=np.uint8)
    buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    # On the generation stream: the model's own collectives of a step may still be running
    # there asynchronously, and collectives must reach every rank in the same order.
    out = mx.distributed.all_sum(mx.array(buffer), group=group, stream=generation_stream)
    mx.eval(out)
    return bytes(np.array(out, copy=False))


def broadcast(group: mx.distributed.Group, payload: bytes | None) -> bytes:
    """Rank 0's `payload` on every rank (others pass None). Sums with zeros: exact for bytes."""
    leader = group.rank() == 0
    data = _LEN.pack(len(payload)) + payload if leader and payload is not None else b""
    head = _all_sum_bytes(data[:HEAD_BYTES], HEAD_BYTES, group)
    (length,) = _LEN.unpack_from(head)
    total = _LEN.size + length
    if total <= HEAD_BYTES:
        return head[_LEN.size : total]
    rest = _all_sum_bytes(data[HEAD_BYTES:], total - HEAD_BYTES, group)
    return head[_LEN.size :] + rest


def share_plan(group: mx.distributed.Group, plan: StepPlan | None) -> StepPlan:
    """Rank 0 passes its plan, the others None; every rank returns rank 0's plan."""
    raw = broadcast(group, _encode(plan) if plan is not None else None)
    return _decode(raw)
