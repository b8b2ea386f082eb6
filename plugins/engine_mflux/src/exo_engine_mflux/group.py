"""The request loop of an image runner that is one rank of a group (the transformer split).

Rank 0 leads: it takes its worker's requests in order and broadcasts each one whole (prompt,
size, seed, steps, uploaded image; rank 0's worker fetched the body the log does not hold, the
other ranks' workers hand their runners the redacted task) with the seed filled in, so every
rank runs the same generation in step. After every denoising step all ranks vote on stopping
(`ring.any_rank`): a cancel that reached any rank stops all of them at the same step, and the
group is free for the next request. Rank 0 streams progress and images to its worker; the other
ranks send their workers only each task's final chunk (those workers wait for it).

While idle, rank 0 broadcasts an empty plan every `heartbeat_s`, so the others notice a lost
leader: they wait for a plan under the watchdog.
"""

from __future__ import annotations

import queue
import random
from dataclasses import dataclass

import mlx.core as mx
import msgspec

from exo_core.plugin import Chunk, FinishChunk, FinishReason, TaskId
from exo_core.plugin.engine import (
    FollowerFinals,
    RunnerOutbox,
    RunnerShutdown,
    RunnerSubmit,
    Watchdog,
    any_rank,
    broadcast,
)
from exo_core.plugin.images import ImageRequest
from exo_engine_mflux.runner_process import Inbox, run_request

# Finals a follower keeps for tasks its worker has not submitted yet.
MAX_REMEMBERED_FINALS = 256


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What rank 0 tells every rank: run this request, this task ended unrun, or stop."""

    task_id: TaskId | None = None
    # None with a task id: the task was cancelled before it started.
    request: ImageRequest | None = None
    stop: bool = False


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Plan).decode


def share_plan(group: mx.distributed.Group, plan: Plan | None) -> Plan:
    """Rank 0 passes its plan, the others None; every rank returns rank 0's plan."""
    return _decode(broadcast(group, _encode(plan) if plan is not None else None))


@dataclass
class ImageGroupLoop:
    loaded: object
    group: mx.distributed.Group
    inbox: Inbox
    out: RunnerOutbox
    watchdog: Watchdog
    step_timeout_s: float = 120.0
    heartbeat_s: float = 2.0

    def run(self) -> int:
        """Serve until told to stop; returns the exit status. Raises when the group fails."""
        return self._lead() if self.group.rank() == 0 else self._follow()

    def _stop_vote(self, task_id: TaskId) -> bool:
        return any_rank(self.group, self.inbox.should_stop(task_id))

    def _share(self, plan: Plan | None, what: str, timeout_s: float) -> Plan:
        with self.watchdog.guard(what, timeout_s):
            return share_plan(self.group, plan)

    def _lead(self) -> int:
        while True:
            try:
                message = self.inbox.queue.get(timeout=self.heartbeat_s)
            except queue.Empty:
                self._share(Plan(), "a heartbeat of the runner group", self.step_timeout_s)
                continue
            if isinstance(message, RunnerShutdown):
                self._share(Plan(stop=True), "stopping the runner group", self.step_timeout_s)
                return 0
            task_id = message.task_id
            request = message.image
            if task_id in self.inbox.cancelled or request is None:
                # Cancelled while it waited its turn (a text task never gets here: the
                # worker's side refuses it): the others end it too.
                self.inbox.cancelled.discard(task_id)
                self._share(Plan(task_id=task_id), "ending a task", self.step_timeout_s)
                self.out.chunk(_unrun(task_id))
                continue
            if request.seed is None:  # every rank must draw the same noise
                request = msgspec.structs.replace(request, seed=random.randrange(2**31))
            plan = Plan(task_id=task_id, request=request)
            self._share(plan, "handing the runner group a request", self.step_timeout_s)
            run_request(self.loaded, task_id, request, self.inbox, self.out.chunk, self._stop_vote)
            if self.inbox.stopping.is_set():
                self._share(Plan(stop=True), "stopping the runner group", self.step_timeout_s)
                return 0

    def _follow(self) -> int:
        finals = FollowerFinals(self.out.chunk, limit=MAX_REMEMBERED_FINALS)
        while True:
            self._take_submits(finals)
            plan = self._share(
                None,
                "waiting for rank 0 of the runner group",
                self.heartbeat_s + self.step_timeout_s,
            )
            if plan.stop:
                return 0
            if plan.task_id is None:
                continue
            if plan.request is None:
                finals.chunk(_unrun(plan.task_id))
                continue
            run_request(
                self.loaded,
                plan.task_id,
                plan.request,
                self.inbox,
                finals.chunk,
                self._stop_vote,
                leader=False,
            )

    def _take_submits(self, finals: FollowerFinals) -> None:
        """The worker's submits here only say that it waits (rank 0 sent the request)."""
        while True:
            try:
                message = self.inbox.queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, RunnerSubmit):
                finals.waits(message.task_id)


def _unrun(task_id: TaskId) -> Chunk:
    return FinishChunk(task_id=task_id, finish_reason=FinishReason.CANCELLED)
