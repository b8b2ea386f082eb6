"""Events: the facts of the replicated log. The master gives each the next index.

A tagged union on the field `type`; every event is applied by `exo_core.reducer.apply`.
"""

from __future__ import annotations

import msgspec

from exo_core.ids import CommandId, InstanceId, ModelId, NodeId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import (
    DownloadProgress,
    Instance,
    NodeResources,
    RunnerInfo,
    Task,
    TaskStatus,
)


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    pass


class MasterElected(_Event, frozen=True, kw_only=True):
    node_id: NodeId
    term: int


class NodeTelemetry(_Event, frozen=True, kw_only=True):
    """A node's periodic report of its resources; the first one adds the node."""

    node_id: NodeId
    hostname: str
    addresses: tuple[str, ...] = ()
    resources: NodeResources
    timestamp: float


class NodeTimedOut(_Event, frozen=True, kw_only=True):
    """A node was unseen too long: it leaves state, with its runners and reports."""

    node_id: NodeId


class TopologyReported(_Event, frozen=True, kw_only=True):
    node_id: NodeId
    peers: tuple[NodeId, ...]


class ModelCardAdded(_Event, frozen=True, kw_only=True):
    card: ModelCard


class ModelCardRemoved(_Event, frozen=True, kw_only=True):
    model_id: ModelId


class DownloadProgressed(_Event, frozen=True, kw_only=True):
    """Event: a model's download on a node moved on (or finished, or failed)."""

    progress: DownloadProgress


class DownloadDeleted(_Event, frozen=True, kw_only=True):
    """Event: a model's files were deleted on a node."""

    node_id: NodeId
    model_id: ModelId


class InstanceCreated(_Event, frozen=True, kw_only=True):
    instance: Instance


class InstanceDeleted(_Event, frozen=True, kw_only=True):
    instance_id: InstanceId
    reason: str = ""


class RunnerStatusChanged(_Event, frozen=True, kw_only=True):
    runner: RunnerInfo


class TaskCreated(_Event, frozen=True, kw_only=True):
    task: Task


class TaskStatusChanged(_Event, frozen=True, kw_only=True):
    task_id: TaskId
    status: TaskStatus
    error: str | None = None


Event = (
    MasterElected
    | NodeTelemetry
    | NodeTimedOut
    | TopologyReported
    | ModelCardAdded
    | ModelCardRemoved
    | DownloadProgressed
    | DownloadDeleted
    | InstanceCreated
    | InstanceDeleted
    | RunnerStatusChanged
    | TaskCreated
    | TaskStatusChanged
)

EVENT_TYPES: tuple[type[_Event], ...] = Event.__args__  # type: ignore[attr-defined]


class IndexedEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An event with its place in the log. `term` is the master term that indexed it;
    `command_id` the command it came from (None: the master's own), so that a command
    retried through the next master is recognised in the log and not applied twice."""

    index: int
    term: int
    event: Event
    command_id: CommandId | None = None
