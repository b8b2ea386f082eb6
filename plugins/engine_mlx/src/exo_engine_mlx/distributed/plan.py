"""The step plan: rank 0 tells every rank which tasks join and leave the batch before a step.

Each rank's worker hands its runner the tasks at its own pace, so the ranks cannot decide batch
composition alone. Rank 0 decides and broadcasts a plan before every step; every rank applies
it, then steps, so all batch generators hold the same sequences in the same order. A join
carries the task's parameters (with a seed filled in for random sampling, so every rank draws
the same tokens): a rank never waits for its own worker to deliver them.

The plan is handed round the ring point to point (0 -> 1 -> ... -> the last rank), not summed
over the group: rank 0's send leaves at once and the plan travels while rank 0 runs its layers,
so on a pipeline it costs no wait on the way to a token (an all_sum of two ranks costs two
exchanges, every step, before rank 0 could start).
"""

from __future__ import annotations

import struct

import mlx.core as mx
import msgspec
import numpy as np
from mlx_lm.generate import generation_stream

from exo_core.plugin import GenerationParams, TaskId

# The first hand-on carries up to this many bytes (a plan with a few joins); longer ones take
# a second of their exact length.
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


def share_plan(group: mx.distributed.Group, plan: StepPlan | None) -> StepPlan:
    """Rank 0 passes its plan, the others None; every rank returns rank 0's plan."""
    # On the generation stream: the model's own collectives of a step may still be running
    # there asynchronously, and collectives must reach every rank in the same order.
    if group.rank() == 0:
        if plan is None:
            raise ValueError("rank 0 must pass its plan")
        data = _encode(plan)
        framed = _LEN.pack(len(data)) + data
        _hand_on(group, framed[:HEAD_BYTES].ljust(HEAD_BYTES, b"\0"))
        if len(framed) > HEAD_BYTES:
            _hand_on(group, framed[HEAD_BYTES:])
        return plan
    head = _hand_on(group, HEAD_BYTES)
    (length,) = _LEN.unpack_from(head)
    total = _LEN.size + length
    framed = head[:total] if total <= HEAD_BYTES else head + _hand_on(group, total - HEAD_BYTES)
    return _decode(framed[_LEN.size :])


def _hand_on(group: mx.distributed.Group, data: bytes | int) -> bytes:
    """Rank 0 sends `data` to rank 1; any other rank receives `data` (a length) bytes from the
    rank before it and, unless it is the last, sends them on. All on the generation stream."""
    rank, size = group.rank(), group.size()
    if isinstance(data, bytes):
        out = mx.array(np.frombuffer(data, dtype=np.uint8))
        mx.eval(mx.distributed.send(out, 1, group=group, stream=generation_stream))
        return data
    got = mx.distributed.recv((data,), mx.uint8, rank - 1, group=group, stream=generation_stream)
    if rank + 1 < size:
        got = mx.depends(
            got, mx.distributed.send(got, rank + 1, group=group, stream=generation_stream)
        )
    mx.eval(got)
    return bytes(np.array(got, copy=False))
