"""The reducer: pure, strict about order, and replay equals live application."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_core.events import EVENT_TYPES, Event, IndexedEvent, InstanceCreated, TaskCreated
from exo_core.generation import ChatMessage, GenerationParams
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.reducer import OutOfOrderEvent, apply, replay
from exo_core.state import Instance, ShardAssignment, State, Task
from exo_core.testing.strategies import events

INSTANCE = Instance(
    instance_id=InstanceId("i0"),
    model_id=ModelId("m0"),
    sharding="pipeline",
    shards=(
        ShardAssignment(
            node_id=NodeId("n0"),
            runner_id=RunnerId("i0-r0"),
            rank=0,
            world_size=1,
            start_layer=0,
            end_layer=4,
        ),
    ),
)
TASK = Task(
    task_id=TaskId("t0"),
    instance_id=InstanceId("i0"),
    model_id=ModelId("m0"),
    origin_node=NodeId("n0"),
    params=GenerationParams(messages=(ChatMessage(role="user", content="hi"),)),
)


def indexed(evs: list[Event]) -> list[IndexedEvent]:
    return [IndexedEvent(index=i, term=1, event=e) for i, e in enumerate(evs)]


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=60))
def test_replay_from_a_serialised_log_equals_live_state(evs: list[Event]) -> None:
    log = indexed(evs)
    live = State()
    for e in log:
        live = apply(live, e)
    # The log as it is stored (msgpack) and replayed after a restart.
    stored = msgspec.msgpack.encode(log)
    restored = msgspec.msgpack.decode(stored, type=list[IndexedEvent])
    assert replay(restored) == live
    assert live.last_index == len(evs) - 1


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_no_event_leaves_state_unserialisable(evs: list[Event]) -> None:
    state = State()
    for e in indexed(evs):
        state = apply(state, e)
        for codec in (msgspec.json, msgspec.msgpack):
            assert codec.decode(codec.encode(state), type=State) == state


@settings(max_examples=100, deadline=None)
@given(st.lists(events, min_size=1, max_size=20))
def test_apply_does_not_change_the_state_it_was_given(evs: list[Event]) -> None:
    state = State()
    for e in indexed(evs):
        before = msgspec.msgpack.encode(state)
        state_after = apply(state, e)
        assert msgspec.msgpack.encode(state) == before
        state = state_after


def test_every_event_kind_is_covered_by_the_strategy() -> None:
    seen: set[type] = set()

    @settings(max_examples=400, deadline=None)
    @given(events)
    def collect(e: Event) -> None:
        seen.add(type(e))

    collect()
    assert seen == set(EVENT_TYPES)


@pytest.mark.parametrize("index", [1, 5, -1])
def test_refuses_an_index_that_is_not_next(index: int) -> None:
    with pytest.raises(OutOfOrderEvent):
        apply(State(), IndexedEvent(index=index, term=1, event=TaskCreated(task=TASK)))


def test_deleting_an_instance_drops_its_runners_and_tasks() -> None:
    inst, t = INSTANCE, TASK
    from exo_core.events import InstanceDeleted, RunnerStatusChanged
    from exo_core.state import RunnerInfo, RunnerStatus

    runner = RunnerInfo(
        runner_id=inst.shards[0].runner_id,
        instance_id=inst.instance_id,
        node_id=inst.shards[0].node_id,
        status=RunnerStatus.READY,
    )
    state = replay(
        indexed(
            [
                InstanceCreated(instance=inst),
                RunnerStatusChanged(runner=runner),
                TaskCreated(task=t),
                InstanceDeleted(instance_id=inst.instance_id),
            ]
        )
    )
    assert state.instances == {} and state.runners == {} and state.tasks == {}
