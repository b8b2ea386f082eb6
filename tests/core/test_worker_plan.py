"""The worker's rules as pure functions over state: which runners to start and stop, which
tasks to run and cancel, when a failed runner restarts or its instance is given up."""

from __future__ import annotations

from exo_core.generation import ErrorChunk, FinishChunk, FinishReason, GenerationParams
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.state import (
    Instance,
    RunnerInfo,
    RunnerStatus,
    ShardAssignment,
    State,
    Task,
    TaskStatus,
)
from exo_core.worker_plan import (
    NO_ANSWER,
    CancelExecution,
    GiveUp,
    Held,
    Restart,
    RetryPolicy,
    RunTask,
    StartRunner,
    StopRunner,
    after_failure,
    peers_started,
    plan,
    stage_times,
    task_outcome,
)

ME, OTHER = NodeId("me"), NodeId("other")


def instance(name: str, *nodes: NodeId) -> Instance:
    shards = tuple(
        ShardAssignment(
            node_id=n,
            runner_id=RunnerId(f"{name}-r{rank}"),
            rank=rank,
            world_size=len(nodes),
            start_layer=rank,
            end_layer=rank + 1,
        )
        for rank, n in enumerate(nodes)
    )
    return Instance(
        instance_id=InstanceId(name), model_id=ModelId("m"), sharding="pipeline", shards=shards
    )


def task(name: str, on: str, status: TaskStatus = TaskStatus.PENDING) -> Task:
    return Task(
        task_id=TaskId(name), instance_id=InstanceId(on), model_id=ModelId("m"),
        origin_node=OTHER, params=GenerationParams(), status=status,
    )  # fmt: skip


def state(*instances: Instance, tasks: tuple[Task, ...] = ()) -> State:
    return State(
        instances={i.instance_id: i for i in instances}, tasks={t.task_id: t for t in tasks}
    )


def test_a_runner_starts_for_each_shard_placed_here_and_stops_when_its_instance_goes() -> None:
    here, split, elsewhere = instance("a", ME), instance("b", OTHER, ME), instance("c", OTHER)
    now = state(here, split, elsewhere)
    assert plan(now, ME, Held(runners={})) == [
        StartRunner(here, here.shards[0]),
        StartRunner(split, split.shards[1]),
    ]
    held = Held(runners={RunnerId("a-r0"): InstanceId("a"), RunnerId("b-r1"): InstanceId("b")})
    assert plan(now, ME, held) == []
    assert plan(state(split), ME, held) == [StopRunner(RunnerId("a-r0"), InstanceId("a"))]


def test_a_pending_task_of_a_local_instance_runs_once() -> None:
    here, elsewhere = instance("a", ME), instance("c", OTHER)
    tasks = (
        task("new", on="a"),
        task("running", on="a", status=TaskStatus.RUNNING),
        task("not-here", on="c"),
    )
    now = state(here, elsewhere, tasks=tasks)
    held = Held(runners={RunnerId("a-r0"): InstanceId("a")})
    assert plan(now, ME, held) == [RunTask(tasks[0], RunnerId("a-r0"))]
    executing = Held(runners=held.runners, executing={TaskId("new")})
    assert plan(now, ME, executing) == []


def test_an_execution_whose_task_left_state_is_cancelled_once() -> None:
    here = instance("a", ME)
    held = Held(runners={RunnerId("a-r0"): InstanceId("a")}, executing={TaskId("gone")})
    assert plan(state(here), ME, held) == [CancelExecution(TaskId("gone"))]
    cancelling = Held(runners=held.runners, executing=held.executing, cancelling={TaskId("gone")})
    assert plan(state(here), ME, cancelling) == []


def test_a_failed_runner_restarts_with_backoff_then_its_instance_is_given_up() -> None:
    policy = RetryPolicy(max_failures=3, base_s=2.0, cap_s=30.0)
    assert [policy.delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert after_failure(1, "oom", policy) == Restart(2.0)
    assert after_failure(2, "oom", policy) == Restart(4.0)
    assert after_failure(3, "oom", policy) == GiveUp(
        "runner failed 3 times in a row; last error: oom"
    )


def test_a_rank_starts_only_when_every_peer_is_starting() -> None:
    group = instance("g", ME, OTHER, NodeId("third"))
    mine = group.shards[0].runner_id

    def runners(*statuses: RunnerStatus) -> State:
        infos = {
            s.runner_id: RunnerInfo(
                runner_id=s.runner_id, instance_id=group.instance_id, node_id=s.node_id, status=st
            )
            for s, st in zip(group.shards[1:], statuses, strict=False)
        }
        return State(instances={group.instance_id: group}, runners=infos)

    assert not peers_started(runners(RunnerStatus.LOADING), group, mine)  # one not reported
    assert not peers_started(runners(RunnerStatus.LOADING, RunnerStatus.DOWNLOADING), group, mine)
    assert peers_started(runners(RunnerStatus.CONNECTING, RunnerStatus.READY), group, mine)


def test_a_tasks_final_status_comes_from_its_last_chunk() -> None:
    t = TaskId("t")
    assert task_outcome(None) == (TaskStatus.FAILED, NO_ANSWER)
    assert task_outcome(ErrorChunk(task_id=t, message="boom")) == (TaskStatus.FAILED, "boom")
    cancelled = FinishChunk(task_id=t, finish_reason=FinishReason.CANCELLED)
    assert task_outcome(cancelled) == (TaskStatus.CANCELLED, None)
    done = FinishChunk(task_id=t, finish_reason=FinishReason.STOP)
    assert task_outcome(done) == (TaskStatus.COMPLETE, None)


def test_a_runner_reports_how_long_each_stage_of_its_start_took() -> None:
    pending, loading, ready = RunnerStatus.PENDING, RunnerStatus.LOADING, RunnerStatus.READY
    since, stages = stage_times(pending, 10.0, {}, loading, now=10.5)
    assert (since, stages) == (10.5, {"pending": 0.5})
    assert stage_times(loading, since, stages, loading, now=11.0) == (10.5, {"pending": 0.5})
    since, stages = stage_times(loading, since, stages, ready, now=12.0)
    assert stages == {"pending": 0.5, "loading": 1.5}
    # Serving is not a stage; a restart after a failure starts the count afresh.
    assert stage_times(ready, since, stages, RunnerStatus.RUNNING, now=13.0)[1] == stages
    assert stage_times(RunnerStatus.FAILED, 14.0, stages, pending, now=15.0) == (15.0, {})
