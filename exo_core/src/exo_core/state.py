"""The replicated cluster state: one frozen value, changed only by the reducer."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from exo_core.generation import GenerationParams
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.images import ImageRequest
from exo_core.model_cards import ModelCard


class NodeResources(msgspec.Struct, frozen=True, kw_only=True):
    """A node's memory, CPUs and accelerators as it last reported them."""

    memory_total: int = 0
    memory_available: int = 0
    cpu_count: int = 0
    cpu_percent: float = 0.0
    disk_total: int = 0
    disk_available: int = 0
    os: str = ""
    engines: tuple[str, ...] = ()
    # The models (of the cards this node knows) its engines can serve; None: not reported,
    # then any node with an engine is a candidate.
    serves: tuple[ModelId, ...] | None = None
    # Resident memory of this node's runners that run in processes of their own, in bytes.
    runner_memory: dict[RunnerId, int] = msgspec.field(default_factory=dict)


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A node as the cluster knows it: host name, addresses, resources and engines."""

    node_id: NodeId
    hostname: str = ""
    # Addresses other nodes can reach this one at (for the mx.distributed ring).
    addresses: tuple[str, ...] = ()
    resources: NodeResources = NodeResources()
    last_seen: float = 0.0
    # Order of first appearance in the log: lower joined earlier (seniority in elections).
    joined_index: int = 0


class MasterInfo(msgspec.Struct, frozen=True, kw_only=True):
    node_id: NodeId
    term: int


class DownloadStatus(StrEnum):
    """Where a model's download on one node stands."""

    PENDING = "pending"
    ONGOING = "ongoing"
    COMPLETED = "completed"
    FAILED = "failed"


class DownloadProgress(msgspec.Struct, frozen=True, kw_only=True):
    """How far a model's download on one node is (bytes, speed, ETA, status)."""

    node_id: NodeId
    model_id: ModelId
    status: DownloadStatus
    downloaded_bytes: int = 0
    total_bytes: int = 0
    speed_bytes_per_s: float = 0.0
    eta_s: float | None = None
    error: str | None = None
    path: str | None = None
    # Found in a read-only models directory: it can be used but never deleted.
    read_only: bool = False

    @property
    def fraction(self) -> float:
        if self.status == DownloadStatus.COMPLETED:
            return 1.0
        if self.status == DownloadStatus.FAILED or self.total_bytes <= 0:
            return 0.0
        return min(1.0, self.downloaded_bytes / self.total_bytes)


Sharding = Literal["pipeline", "tensor"]
"""How an instance splits a model: by layers (pipeline) or within layers (tensor)."""


class ShardAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One node's part of an instance: its rank and, for pipelines, its layers [start, end)."""

    node_id: NodeId
    runner_id: RunnerId
    rank: int
    world_size: int
    start_layer: int
    end_layer: int
    # host:port this rank listens on for the mx.distributed ring (empty for a single rank).
    ring_address: str = ""


class Instance(msgspec.Struct, frozen=True, kw_only=True):
    """A model placed on one or more nodes: its sharding and each rank's shard."""

    instance_id: InstanceId
    model_id: ModelId
    sharding: Sharding
    shards: tuple[ShardAssignment, ...]
    # Where the operator let it be placed: only these nodes (all when empty), none of the
    # excluded ones; kept so that a re-placement after a node loss honours them too.
    nodes: tuple[NodeId, ...] = ()
    exclude_nodes: tuple[NodeId, ...] = ()

    def shard_on(self, node_id: NodeId) -> ShardAssignment | None:
        return next((s for s in self.shards if s.node_id == node_id), None)

    @property
    def leader(self) -> ShardAssignment:
        return next(s for s in self.shards if s.rank == 0)


class RunnerStatus(StrEnum):
    """Where a runner is in its life, from pending through ready and running to stopped."""

    PENDING = "pending"
    DOWNLOADING = "downloading"
    CONNECTING = "connecting"
    LOADING = "loading"
    WARMING_UP = "warming_up"
    READY = "ready"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"


class RunnerInfo(msgspec.Struct, frozen=True, kw_only=True):
    runner_id: RunnerId
    instance_id: InstanceId
    node_id: NodeId
    status: RunnerStatus
    error: str | None = None
    failures: int = 0
    # When the current status began (wall clock, the worker's), and the seconds each earlier
    # stage of this start took (downloading, connecting, loading, warming_up...).
    since: float = 0.0
    stage_seconds: dict[str, float] = msgspec.field(default_factory=dict)
    # The model directory the runner loads (so that a deletion by folder name sees it in use).
    model_path: str = ""


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_TASK_STATUSES = frozenset({TaskStatus.COMPLETE, TaskStatus.FAILED, TaskStatus.CANCELLED})


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """A generation (or image) request the cluster runs on an instance."""

    task_id: TaskId
    instance_id: InstanceId
    model_id: ModelId
    # The node whose API holds the caller's request: chunks are sent there.
    origin_node: NodeId
    params: GenerationParams
    # Set for an image task (its `params` stay empty).
    image: ImageRequest | None = None
    # The id the caller's response carries (`chatcmpl-...`): any node cancels the task by it.
    request_id: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    status: TaskStatus = TaskStatus.PENDING
    error: str | None = None


class State(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the cluster agrees on. `last_index` is the index of the last applied event."""

    last_index: int = -1
    master: MasterInfo | None = None
    nodes: dict[NodeId, NodeInfo] = msgspec.field(default_factory=dict)
    # For each node, the peers it reports it can reach.
    topology: dict[NodeId, tuple[NodeId, ...]] = msgspec.field(default_factory=dict)
    # Custom model cards (added through the API); built-in cards come from plugins on each node.
    model_cards: dict[ModelId, ModelCard] = msgspec.field(default_factory=dict)
    downloads: dict[NodeId, dict[ModelId, DownloadProgress]] = msgspec.field(default_factory=dict)
    instances: dict[InstanceId, Instance] = msgspec.field(default_factory=dict)
    runners: dict[RunnerId, RunnerInfo] = msgspec.field(default_factory=dict)
    # Tasks that are still pending or running; a task leaves state when it ends.
    tasks: dict[TaskId, Task] = msgspec.field(default_factory=dict)
