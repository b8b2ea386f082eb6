"""The pure reducer: `apply(state, indexed_event) -> state`. Nothing else changes state.

Every handler builds new mappings instead of mutating the old ones, so a `State` value seen by
anyone stays what it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import msgspec

from exo_core.events import (
    DownloadDeleted,
    DownloadProgressed,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    MasterElected,
    ModelCardAdded,
    ModelCardRemoved,
    NodeTelemetry,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskCreated,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.state import TERMINAL_TASK_STATUSES, MasterInfo, NodeInfo, State, TaskStatus

K = TypeVar("K")
V = TypeVar("V")


class OutOfOrderEvent(ValueError):
    """An event whose index is not the one right after the state's last index."""


def apply(state: State, indexed: IndexedEvent) -> State:
    """Apply one indexed event. Refuses any index but `state.last_index + 1`."""
    if indexed.index != state.last_index + 1:
        raise OutOfOrderEvent(
            f"event {indexed.index} cannot follow {state.last_index}; expected {state.last_index + 1}"
        )
    changes = _HANDLERS[type(indexed.event)](state, indexed.event, indexed.index)
    return msgspec.structs.replace(state, last_index=indexed.index, **changes)


def replay(events: list[IndexedEvent], state: State | None = None) -> State:
    state = state or State()
    for indexed in events:
        state = apply(state, indexed)
    return state


def _with(mapping: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    new = dict(mapping)
    new[key] = value
    return new


def _without(mapping: Mapping[K, V], *keys: K) -> dict[K, V]:
    return {k: v for k, v in mapping.items() if k not in keys}


Changes = dict[str, Any]


def _master_elected(state: State, e: MasterElected, index: int) -> Changes:
    return {"master": MasterInfo(node_id=e.node_id, term=e.term)}


def _node_telemetry(state: State, e: NodeTelemetry, index: int) -> Changes:
    old = state.nodes.get(e.node_id)
    node = NodeInfo(
        node_id=e.node_id,
        hostname=e.hostname,
        addresses=e.addresses,
        resources=e.resources,
        last_seen=max(e.timestamp, old.last_seen if old else 0.0),
        joined_index=old.joined_index if old else index,
    )
    return {"nodes": _with(state.nodes, e.node_id, node)}


def _node_timed_out(state: State, e: NodeTimedOut, index: int) -> Changes:
    return {
        "nodes": _without(state.nodes, e.node_id),
        "topology": {
            n: tuple(p for p in peers if p != e.node_id)
            for n, peers in state.topology.items()
            if n != e.node_id
        },
        "downloads": _without(state.downloads, e.node_id),
        "runners": {r: info for r, info in state.runners.items() if info.node_id != e.node_id},
    }


def _topology(state: State, e: TopologyReported, index: int) -> Changes:
    return {"topology": _with(state.topology, e.node_id, tuple(sorted(e.peers)))}


def _card_added(state: State, e: ModelCardAdded, index: int) -> Changes:
    return {"model_cards": _with(state.model_cards, e.card.model_id, e.card)}


def _card_removed(state: State, e: ModelCardRemoved, index: int) -> Changes:
    return {"model_cards": _without(state.model_cards, e.model_id)}


def _download(state: State, e: DownloadProgressed, index: int) -> Changes:
    p = e.progress
    per_node = _with(state.downloads.get(p.node_id, {}), p.model_id, p)
    return {"downloads": _with(state.downloads, p.node_id, per_node)}


def _download_deleted(state: State, e: DownloadDeleted, index: int) -> Changes:
    per_node = _without(state.downloads.get(e.node_id, {}), e.model_id)
    return {"downloads": _with(state.downloads, e.node_id, per_node)}


def _instance_created(state: State, e: InstanceCreated, index: int) -> Changes:
    return {"instances": _with(state.instances, e.instance.instance_id, e.instance)}


def _instance_deleted(state: State, e: InstanceDeleted, index: int) -> Changes:
    # Its runners and unfinished tasks go with it; workers stop them when they see this.
    return {
        "instances": _without(state.instances, e.instance_id),
        "runners": {
            r: info for r, info in state.runners.items() if info.instance_id != e.instance_id
        },
        "tasks": {t: task for t, task in state.tasks.items() if task.instance_id != e.instance_id},
    }


def _runner_status(state: State, e: RunnerStatusChanged, index: int) -> Changes:
    if e.runner.instance_id not in state.instances:
        return {}  # a late report from a runner whose instance is gone
    return {"runners": _with(state.runners, e.runner.runner_id, e.runner)}


def _task_created(state: State, e: TaskCreated, index: int) -> Changes:
    if e.task.instance_id not in state.instances:
        return {}
    return {"tasks": _with(state.tasks, e.task.task_id, e.task)}


def _task_status(state: State, e: TaskStatusChanged, index: int) -> Changes:
    task = state.tasks.get(e.task_id)
    if task is None:
        return {}
    if e.status in TERMINAL_TASK_STATUSES:
        return {"tasks": _without(state.tasks, e.task_id)}
    updated = msgspec.structs.replace(task, status=TaskStatus(e.status), error=e.error)
    return {"tasks": _with(state.tasks, e.task_id, updated)}


_HANDLERS: dict[type[Event], Callable[[State, Any, int], Changes]] = {
    MasterElected: _master_elected,
    NodeTelemetry: _node_telemetry,
    NodeTimedOut: _node_timed_out,
    TopologyReported: _topology,
    ModelCardAdded: _card_added,
    ModelCardRemoved: _card_removed,
    DownloadProgressed: _download,
    DownloadDeleted: _download_deleted,
    InstanceCreated: _instance_created,
    InstanceDeleted: _instance_deleted,
    RunnerStatusChanged: _runner_status,
    TaskCreated: _task_created,
    TaskStatusChanged: _task_status,
}
