"""What the worker should do, decided from state: pure functions, no runners, I/O or sleeps.

`plan` compares the cluster state with what this node holds (its runners and the tasks it is
executing) and says what to change; `after_failure` says whether a failed runner restarts (and
after how long) or its instance is given up; `task_outcome` turns a task's last chunk into its
final status. `exo_core.worker` carries the actions out, as `exo_core.master` does for
`exo_core.decide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from exo_core.generation import ErrorChunk, FinishChunk, FinishReason
from exo_core.ids import InstanceId, NodeId, RunnerId, TaskId
from exo_core.state import Instance, RunnerStatus, ShardAssignment, State, Task, TaskStatus

# -- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartRunner:
    """Supervise a runner for this node's shard of `instance` (fetch, load, serve, restart)."""

    instance: Instance
    shard: ShardAssignment


@dataclass(frozen=True)
class StopRunner:
    """The instance left state: stop its runner here and forget its failures."""

    runner_id: RunnerId
    instance_id: InstanceId


@dataclass(frozen=True)
class RunTask:
    """Execute a pending task on this node's runner of its instance."""

    task: Task
    runner_id: RunnerId


@dataclass(frozen=True)
class CancelExecution:
    """The task left state (cancelled, or its caller went away): stop generating it."""

    task_id: TaskId


WorkerAction = StartRunner | StopRunner | RunTask | CancelExecution


@dataclass(frozen=True)
class Held:
    """What this node holds now: its runners (with their instance) and its executions."""

    runners: Mapping[RunnerId, InstanceId]
    executing: Set[TaskId] = frozenset()
    cancelling: Set[TaskId] = frozenset()


def plan(state: State, node_id: NodeId, held: Held) -> list[WorkerAction]:
    """The actions that make this node match `state`: runners started for every shard placed
    here and stopped for every instance gone, then executions started for pending tasks of
    local instances and cancelled for tasks gone from state. Each is planned once: an
    execution or a cancel already under way is in `held`."""
    wanted = {
        shard.runner_id: (instance, shard)
        for instance in state.instances.values()
        if (shard := instance.shard_on(node_id)) is not None
    }
    actions: list[WorkerAction] = [
        StartRunner(instance, shard)
        for runner_id, (instance, shard) in wanted.items()
        if runner_id not in held.runners
    ]
    actions += [
        StopRunner(runner_id, instance_id)
        for runner_id, instance_id in held.runners.items()
        if runner_id not in wanted
    ]
    local = {instance.instance_id: runner_id for runner_id, (instance, _) in wanted.items()}
    actions += [
        RunTask(task, local[task.instance_id])
        for task in state.tasks.values()
        if task.status == TaskStatus.PENDING
        and task.task_id not in held.executing
        and task.instance_id in local
    ]
    actions += [
        CancelExecution(task_id)
        for task_id in held.executing
        if task_id not in state.tasks and task_id not in held.cancelling
    ]
    return actions


# -- runner failures --------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Restart with exponential backoff; give the instance up after `max_failures` in a row
    (a runner that reached READY in between starts the count over)."""

    max_failures: int = 3
    base_s: float = 2.0
    cap_s: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds before restart number `failures` (1-based): 2, 4, 8, 16, 30, 30..."""
        return min(self.cap_s, self.base_s * 2 ** max(0, failures - 1))


@dataclass(frozen=True)
class Restart:
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """Delete the instance, with this reason (its callers' requests fail with it)."""

    reason: str


def after_failure(failures: int, message: str, policy: RetryPolicy) -> Restart | GiveUp:
    """What follows failure number `failures` in a row of a runner, which failed with
    `message`."""
    if failures >= policy.max_failures:
        return GiveUp(f"runner failed {failures} times in a row; last error: {message}")
    return Restart(policy.delay(failures))


def stage_times(
    previous: RunnerStatus,
    since: float,
    stages: Mapping[str, float],
    status: RunnerStatus,
    now: float,
) -> tuple[float, dict[str, float]]:
    """When a runner's status `status` began, and the seconds each earlier stage of this start
    took (downloading, loading...), after it was `previous` since `since`. A restart begins its
    stages afresh; READY <-> RUNNING is serving, not a stage."""
    if status == previous:
        return since, dict(stages)
    if previous in (RunnerStatus.FAILED, RunnerStatus.STOPPED):
        return now, {}
    if previous in (RunnerStatus.READY, RunnerStatus.RUNNING):
        return now, dict(stages)
    return now, {**stages, previous.value: round(now - since, 3)}


# -- groups and tasks -------------------------------------------------------------------------

# A group's rank may start its runner once every other rank is at least this far.
STARTED = frozenset(
    {
        RunnerStatus.CONNECTING,
        RunnerStatus.LOADING,
        RunnerStatus.WARMING_UP,
        RunnerStatus.READY,
        RunnerStatus.RUNNING,
    }
)


def peers_started(state: State, instance: Instance, runner_id: RunnerId) -> bool:
    """Whether every other rank of `instance` has its model and is starting: only then can
    a group form, so a rank waits for its peers' downloads rather than time out connecting."""
    peers = (state.runners.get(s.runner_id) for s in instance.shards if s.runner_id != runner_id)
    return all(r is not None and r.status in STARTED for r in peers)


NO_ANSWER = "the runner ended without an answer"


def task_outcome(final: FinishChunk | ErrorChunk | None) -> tuple[TaskStatus, str | None]:
    """A task's final status (and error) from the last chunk its runner sent, if any."""
    match final:
        case None:
            return TaskStatus.FAILED, NO_ANSWER
        case ErrorChunk(message=message):
            return TaskStatus.FAILED, message
        case FinishChunk(finish_reason=FinishReason.CANCELLED):
            return TaskStatus.CANCELLED, None
        case FinishChunk():
            return TaskStatus.COMPLETE, None
