"""The step plan: rank 0 tells every rank which tasks join and leave the batch before a step.

Each rank's worker hands its runner the tasks at its own pace, so the ranks cannot decide batch
composition alone. Rank 0 decides and broadcasts a plan before every step; every rank applies
it, then steps, so all batch generators hold the same sequences in the same order. A join
carries the task's parameters (with a seed filled in for random sampling, so every rank draws
the same tokens): a rank never waits for its own worker to deliver them.
"""

from __future__ import annotations

import mlx.core as mx
import msgspec
from mlx_lm.generate import generation_stream

from exo_core.plugin import GenerationParams, TaskId
from exo_core.plugin.engine import broadcast


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
    raw = broadcast(group, _encode(plan) if plan is not None else None, generation_stream)
    return _decode(raw)
