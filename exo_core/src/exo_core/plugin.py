"""The plugin API: everything a plugin needs, from this one module.

    from exo_core.plugin import InjectedNode, hookimpl

Every other `exo_core` module is the core's own business and may change in any release; what
this module exports changes only with `API_VERSION`. A plugin depends on the exo-core versions
that carry the API major version it was written for (see docs/plugins.md):

    dependencies = ["exo-core>=0.1,<0.2"]

and may check `API_VERSION` at import time. Tests use `exo_core.testing` as well.
"""

from __future__ import annotations

from litestar.di import NamedDependency

from exo_core.api.dialect import (
    NDJSON_MEDIA_TYPE,
    UNFINISHED,
    AnyRequest,
    GenerationFailed,
    Renderer,
    answer,
    answered,
    decode_body,
    dialect_router,
    documented_body,
    exception_handlers,
    finish_failure,
    ndjson,
    sse,
)
from exo_core.api.errors import native_error
from exo_core.api.security import ACCEPTS_OPT
from exo_core.blas import (
    GEMM_SYMBOLS,
    blas_threads,
    build_prefix_shim,
    candidates,
    find_fast_blas,
    loaded_blas,
    preload_works,
    runner_env,
    shim_for,
)
from exo_core.cluster_key import derive as derive_key
from exo_core.cluster_key import network_key
from exo_core.commands import (
    AddModelCard,
    CancelTask,
    Command,
    CommandResult,
    DeleteDownload,
    DeleteInstance,
    PlaceInstance,
    RemoveModelCard,
    ReportEvents,
)
from exo_core.config import NodeConfig
from exo_core.context import Job, NodeContext
from exo_core.downloads import Downloader, DownloadFailed, ProgressReporter
from exo_core.engine import Engine, Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_core.events import (
    DownloadDeleted,
    DownloadProgressed,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
)
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
    ToolSpec,
    TopLogprob,
    Usage,
)
from exo_core.hookspecs import hookimpl
from exo_core.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId, new_id
from exo_core.images import ImageFormat, ImageRequest, InvalidImageRequest, parse_size
from exo_core.model_cards import (
    Capability,
    ModelCard,
    ModelComponent,
    ModelTask,
    load_card_dir,
    load_card_file,
)
from exo_core.parsers import (
    ChainedParser,
    OutputParser,
    ParserFactory,
    TaggedBlockParser,
    ThinkParser,
    ToolBlockParser,
    ToolBlockReader,
    ToolCallParseError,
    read_hermes,
    tool_call,
)
from exo_core.paths import (
    UnsafeModelPath,
    check_model_id,
    is_safe_model_id,
    model_id_problem,
    model_path,
    remove_model_dir,
)
from exo_core.placement import human_bytes, place, runnable, split_layers
from exo_core.placement_types import NodeShare, PlacementOption, PlacementRefused, PlacementRequest
from exo_core.redact import public_message
from exo_core.service import (
    GenerationError,
    GenerationService,
    InvalidRequest,
    ModelNotFound,
    NoInstance,
)
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    Instance,
    NodeInfo,
    NodeResources,
    RunnerStatus,
    ShardAssignment,
    Sharding,
    State,
    Task,
    TaskStatus,
)
from exo_core.transport.base import (
    PayloadTooLarge,
    PeerConnected,
    PeerDisconnected,
    RequestFailed,
    RequestHandler,
    Transport,
    TransportError,
    TransportEvent,
    TransportLagged,
    TransportMessage,
)

API_VERSION = "1.0"
"""major.minor: the minor grows when something is added, the major when something changes."""

InjectedNode = NamedDependency[NodeContext]
"""Annotate a route handler's `node` parameter with this to receive the node's context."""

InjectedGeneration = NamedDependency[GenerationService]
"""Annotate a route handler's `generation` parameter with this to receive the generation
service (model id and `GenerationParams` in, chunks out)."""

__all__ = [
    "ACCEPTS_OPT",
    "API_VERSION",
    "GEMM_SYMBOLS",
    "NDJSON_MEDIA_TYPE",
    "UNFINISHED",
    "AddModelCard",
    "AnyRequest",
    "CancelTask",
    "Capability",
    "ChainedParser",
    "ChatMessage",
    "Chunk",
    "Command",
    "CommandId",
    "CommandResult",
    "ContentPart",
    "DeleteDownload",
    "DeleteInstance",
    "DownloadDeleted",
    "DownloadFailed",
    "DownloadProgress",
    "DownloadProgressed",
    "DownloadStatus",
    "Downloader",
    "Engine",
    "ErrorChunk",
    "Event",
    "FinishChunk",
    "FinishReason",
    "GenerationError",
    "GenerationFailed",
    "GenerationParams",
    "GenerationService",
    "ImageChunk",
    "ImageFormat",
    "ImageRequest",
    "IndexedEvent",
    "InjectedGeneration",
    "InjectedNode",
    "Instance",
    "InstanceCreated",
    "InstanceDeleted",
    "InstanceId",
    "InvalidImageRequest",
    "InvalidRequest",
    "Job",
    "KeepAliveChunk",
    "ModelCard",
    "ModelComponent",
    "ModelId",
    "ModelNotFound",
    "ModelTask",
    "NoInstance",
    "NodeConfig",
    "NodeContext",
    "NodeId",
    "NodeInfo",
    "NodeResources",
    "NodeShare",
    "OutputParser",
    "ParserFactory",
    "PayloadTooLarge",
    "PeerConnected",
    "PeerDisconnected",
    "PlaceInstance",
    "PlacementOption",
    "PlacementRefused",
    "PlacementRequest",
    "ProgressChunk",
    "ProgressReporter",
    "RemoveModelCard",
    "Renderer",
    "ReportEvents",
    "RequestFailed",
    "RequestHandler",
    "Runner",
    "RunnerDied",
    "RunnerId",
    "RunnerSpec",
    "RunnerStatus",
    "SamplingParams",
    "ShardAssignment",
    "Sharding",
    "State",
    "StatusReporter",
    "TaggedBlockParser",
    "Task",
    "TaskId",
    "TaskStatus",
    "TextChunk",
    "ThinkParser",
    "ThinkingChunk",
    "TokenLogprob",
    "ToolBlockParser",
    "ToolBlockReader",
    "ToolCall",
    "ToolCallChunk",
    "ToolCallParseError",
    "ToolSpec",
    "TopLogprob",
    "Transport",
    "TransportError",
    "TransportEvent",
    "TransportLagged",
    "TransportMessage",
    "UnsafeModelPath",
    "Usage",
    "answer",
    "answered",
    "blas_threads",
    "build_prefix_shim",
    "candidates",
    "check_model_id",
    "decode_body",
    "derive_key",
    "dialect_router",
    "documented_body",
    "exception_handlers",
    "find_fast_blas",
    "finish_failure",
    "hookimpl",
    "human_bytes",
    "is_safe_model_id",
    "load_card_dir",
    "load_card_file",
    "loaded_blas",
    "model_id_problem",
    "model_path",
    "native_error",
    "ndjson",
    "network_key",
    "new_id",
    "parse_size",
    "place",
    "preload_works",
    "public_message",
    "read_hermes",
    "remove_model_dir",
    "runnable",
    "runner_env",
    "shim_for",
    "split_layers",
    "sse",
    "tool_call",
]
