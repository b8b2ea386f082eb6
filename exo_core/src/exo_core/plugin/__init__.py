"""The plugin API: the hooks, the node's context, the data model and the errors.

    from exo_core.plugin import InjectedNode, hookimpl
    from exo_core.plugin.engine import Engine, Runner, RunnerSpec

This package holds what every plugin shares; each job's toolkit is a sub-module of it
(`dialect`, `engine`, `transport`, `download`, `cards`, `parsers`, `images`, `placement`; see
docs/plugins.md). Every other `exo_core` module is the core's own business and may change in
any release; what `exo_core.plugin` and its sub-modules export changes only with `API_VERSION`.
A plugin depends on the exo-core versions that carry the API major version it was written for:

    dependencies = ["exo-core>=0.2,<0.3"]

and may check `API_VERSION` at import time. Tests use `exo_core.testing` as well.
"""

from __future__ import annotations

from litestar.di import NamedDependency

from exo_core.config import NodeConfig, cache_dir
from exo_core.context import NodeContext
from exo_core.events import IndexedEvent
from exo_core.generation import (
    ChatMessage,
    Chunk,
    ContentPart,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    ImageChunk,
    KeepAliveChunk,
    ProgressChunk,
    SamplingParams,
    TextChunk,
    ThinkingChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
    ToolSpec,
    TopLogprob,
    Usage,
)
from exo_core.hookspecs import hookimpl
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId, new_id
from exo_core.model_cards import Capability, ModelCard, ModelComponent, ModelTask
from exo_core.paths import UnsafeModelPath
from exo_core.placement_types import PlacementRefused
from exo_core.redact import public_message
from exo_core.service import GenerationService, InvalidRequest, ModelNotFound
from exo_core.state import (
    Instance,
    NodeInfo,
    NodeResources,
    RunnerStatus,
    ShardAssignment,
    Sharding,
    State,
    Task,
)

API_VERSION = "2.0"
"""major.minor: the minor grows when something is added, the major when something changes
(2.0: the toolkits moved into sub-modules and names no plugin used left the API)."""

InjectedNode = NamedDependency[NodeContext]
"""Annotate a route handler's `node` parameter with this to receive the node's context."""

InjectedGeneration = NamedDependency[GenerationService]
"""Annotate a route handler's `generation` parameter with this to receive the generation
service (model id and `GenerationParams` in, chunks out)."""

__all__ = [
    # the hooks and the node's context
    "API_VERSION",
    # model cards
    "Capability",
    # a generation: what goes in, what comes out
    "ChatMessage",
    "Chunk",
    "ContentPart",
    "ErrorChunk",
    "FinishChunk",
    "FinishReason",
    "GenerationParams",
    "GenerationService",
    "ImageChunk",
    # the replicated cluster state
    "IndexedEvent",
    "InjectedGeneration",
    "InjectedNode",
    "Instance",
    # ids
    "InstanceId",
    # errors
    "InvalidRequest",
    "KeepAliveChunk",
    "ModelCard",
    "ModelComponent",
    "ModelId",
    "ModelNotFound",
    "ModelTask",
    "NodeConfig",
    "NodeContext",
    "NodeId",
    "NodeInfo",
    "NodeResources",
    "PlacementRefused",
    "ProgressChunk",
    "RunnerId",
    "RunnerStatus",
    "SamplingParams",
    "ShardAssignment",
    "Sharding",
    "State",
    "Task",
    "TaskId",
    "TextChunk",
    "ThinkingChunk",
    "TokenLogprob",
    "ToolCall",
    "ToolCallChunk",
    "ToolCallDeltaChunk",
    "ToolSpec",
    "TopLogprob",
    "UnsafeModelPath",
    "Usage",
    "cache_dir",
    "hookimpl",
    "new_id",
    "public_message",
]
