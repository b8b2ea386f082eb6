"""Commands: requests to the master, which answers each with a `CommandResult`.

The master turns a command into events (or refuses it with a status and a message); it never
changes state any other way.
"""

from __future__ import annotations

import msgspec

from exo_core.events import Event
from exo_core.ids import CommandId, InstanceId, ModelId, NodeId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import Sharding, Task


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    pass


class PlaceInstance(_Command, frozen=True, kw_only=True):
    model_id: ModelId
    sharding: Sharding = "pipeline"
    min_nodes: int = 1
    instance_id: InstanceId | None = None
    # Nodes the placement must include (exo's `node_ids`); empty: any nodes.
    node_ids: tuple[NodeId, ...] = ()
    # The sender's card, for a master that does not know the model (a card from a plugin
    # only some nodes have); the master's own card wins.
    card: ModelCard | None = None
    # Only these nodes may run it (all when empty), and none of the excluded ones.
    nodes: tuple[NodeId, ...] = ()
    exclude_nodes: tuple[NodeId, ...] = ()


class DeleteInstance(_Command, frozen=True, kw_only=True):
    instance_id: InstanceId
    reason: str = "deleted by request"


class SubmitTask(_Command, frozen=True, kw_only=True):
    task: Task


class CancelTask(_Command, frozen=True, kw_only=True):
    task_id: TaskId


class AddModelCard(_Command, frozen=True, kw_only=True):
    """Command: add (or replace) a custom model card in the cluster's state."""

    card: ModelCard


class RemoveModelCard(_Command, frozen=True, kw_only=True):
    """Command: remove a custom model card from the cluster's state."""

    model_id: ModelId


class DeleteDownload(_Command, frozen=True, kw_only=True):
    """Command: delete a model's files on one node."""

    node_id: NodeId
    model_id: ModelId


class ReportEvents(_Command, frozen=True, kw_only=True):
    """Facts a node observed itself (telemetry, runner status, downloads) for the log."""

    events: tuple[Event, ...]


Command = (
    PlaceInstance
    | DeleteInstance
    | SubmitTask
    | CancelTask
    | AddModelCard
    | RemoveModelCard
    | DeleteDownload
    | ReportEvents
)


class CommandEnvelope(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A command with its id, so a retried send is applied once."""

    command_id: CommandId
    origin: NodeId
    command: Command


class CommandResult(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The master's answer. `status` follows HTTP: 200 ok, 404 unknown id, 409 cannot fit..."""

    command_id: CommandId
    status: int = 200
    message: str = ""
    # Index of the last event the command produced (the caller may wait until it applies it).
    last_index: int = -1
    instance_id: InstanceId | None = None

    @property
    def ok(self) -> bool:
        return self.status < 400
