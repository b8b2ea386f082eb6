"""The request loop of a runner in a group: rank 0 leads, the other ranks follow its plans.

Every step is: rank 0 broadcasts a `StepPlan` (tasks joining, tasks cancelled, stop), every rank
applies it to its batch engine, then every rank steps, the model exchanging hidden states or
partial sums inside the step. Rank 0 streams every chunk to its worker; a follower sends its
worker only the final chunk of each task (the worker there waits for it), remembering finals
the worker has not asked for yet.

Every collective runs under the watchdog: a step that does not complete (a peer vanished
without closing its sockets) ends the runner with a clear error instead of a hang. While idle,
rank 0 broadcasts an empty plan every `heartbeat_s`, so followers notice a lost leader too.
"""

from __future__ import annotations

import queue
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import msgspec

from exo_core.plugin import Chunk, FinishChunk, FinishReason, GenerationParams, TaskId
from exo_core.plugin.engine import (
    FollowerFinals,
    RunnerCancel,
    RunnerShutdown,
    RunnerSubmit,
    ToRunner,
    Watchdog,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.distributed.plan import Join, StepPlan, share_plan

# Finals a follower keeps for tasks its worker has not submitted yet.
MAX_REMEMBERED_FINALS = 1024


class GroupDiverged(RuntimeError):
    """A follower's batch no longer matches rank 0's: their outputs would be garbage."""


class GroupStopped(RuntimeError):
    """Rank 0 stopped (its worker stopped it): the group is gone, so this rank ends too."""


def with_seed(params: GenerationParams) -> GenerationParams:
    """Random sampling with a seed, so every rank draws the same token from the same logits."""
    sampling = params.sampling
    if sampling.temperature == 0 or sampling.seed is not None:
        return params
    seeded = msgspec.structs.replace(sampling, seed=secrets.randbits(31))
    return msgspec.structs.replace(params, sampling=seeded)


@dataclass
class GroupLoop:
    engine: BatchEngine
    group: mx.distributed.Group
    inbox: queue.Queue[ToRunner]
    send_chunk: Callable[[Chunk], None]
    watchdog: Watchdog
    step_timeout_s: float = 60.0
    heartbeat_s: float = 2.0
    _fingerprint: int = 0
    # Follower only: tasks its worker waits on, and finals the worker has not asked for yet.
    _answers: FollowerFinals = field(init=False)

    def __post_init__(self) -> None:
        self._answers = FollowerFinals(self.send_chunk, limit=MAX_REMEMBERED_FINALS)

    @property
    def rank(self) -> int:
        return self.group.rank()

    def run(self) -> int:
        """Serve until told to stop; returns the exit status. Raises when the group fails."""
        self._fingerprint = self.engine.fingerprint()
        return self._lead() if self.rank == 0 else self._follow()

    # -- both -------------------------------------------------------------------------------

    def _apply_and_step(self, plan: StepPlan) -> list[Chunk]:
        out: list[Chunk] = []
        for join in plan.joins:
            out.extend(self.engine.submit(join.task_id, join.params))
        for task_id in plan.cancels:
            out.extend(self.engine.cancel(task_id))
        out.extend(self.engine.step())
        return out

    def _drain(self, block: bool) -> list[ToRunner]:
        messages: list[ToRunner] = []
        if block:
            try:
                messages.append(self.inbox.get(timeout=self.heartbeat_s))
            except queue.Empty:
                return messages
        while True:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                return messages

    # -- rank 0 -----------------------------------------------------------------------------

    def _lead(self) -> int:
        while True:
            messages = self._drain(block=not self.engine.active)
            joins: list[Join] = []
            cancels: list[TaskId] = []
            stop = False
            for message in messages:
                match message:
                    case RunnerSubmit(task_id=task_id, params=params):
                        joins.append(Join(task_id=task_id, params=with_seed(params)))
                    case RunnerCancel(task_id=task_id):
                        known = set(self.engine.task_ids()) | {j.task_id for j in joins}
                        if task_id in known:
                            cancels.append(task_id)
                    case RunnerShutdown():
                        stop = True
            plan = StepPlan(
                joins=tuple(joins),
                cancels=tuple(cancels),
                fingerprint=self._fingerprint,
                stop=stop,
            )
            with self.watchdog.guard("a step of the runner group", self.step_timeout_s):
                share_plan(self.group, plan)
                if stop:
                    return 0
                chunks = self._apply_and_step(plan)
            for chunk in chunks:
                self.send_chunk(chunk)
            self._fingerprint = self.engine.fingerprint()

    # -- other ranks ------------------------------------------------------------------------

    def _follow(self) -> int:
        while True:
            for message in self._drain(block=False):
                match message:
                    case RunnerSubmit(task_id=task_id):
                        self._answers.waits(task_id)
                    case RunnerCancel(task_id=task_id):
                        self._worker_cancels(task_id)
                    case RunnerShutdown():
                        return 0
            with self.watchdog.guard(
                "waiting for rank 0 of the runner group", self.heartbeat_s + self.step_timeout_s
            ):
                plan = share_plan(self.group, None)
            if plan.fingerprint != self._fingerprint:
                raise GroupDiverged(
                    f"rank {self.rank} no longer runs the same batch as rank 0 "
                    f"(fingerprint {self._fingerprint:#x}, rank 0 has {plan.fingerprint:#x})"
                )
            if plan.stop:
                raise GroupStopped("rank 0 stopped, so the runner group ended")
            with self.watchdog.guard("a step of the runner group", self.step_timeout_s):
                chunks = self._apply_and_step(plan)
            for chunk in chunks:
                self._answers.chunk(chunk)
            self._fingerprint = self.engine.fingerprint()

    def _worker_cancels(self, task_id: TaskId) -> None:
        # A task rank 0 runs ends when rank 0 cancels it; one it never started ends now.
        if task_id in self._answers.awaiting and task_id not in self.engine.task_ids():
            self._answers.awaiting.discard(task_id)
            self.send_chunk(FinishChunk(task_id=task_id, finish_reason=FinishReason.CANCELLED))

    def waiting_tasks(self) -> list[TaskId]:
        """Tasks whose worker still waits for an answer (to fail them if the group fails)."""
        return sorted(set(self.engine.task_ids()) | self._answers.awaiting)
