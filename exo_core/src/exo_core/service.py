"""Generation as API dialects see it: a model id and `GenerationParams` in, chunks out.

It resolves the model's card, validates the request against it, finds (or places) an instance,
submits the task through the master and streams the task's chunks back, parsed into text,
thinking and tool calls. Leaving the stream early (a client that disconnects) cancels the task.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Protocol

import anyio
import msgspec
from loguru import logger

from exo_core.bodies import without_body
from exo_core.commands import CancelTask, PlaceInstance, SubmitTask
from exo_core.generation import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    KeepAliveChunk,
    ProgressChunk,
    TextChunk,
    ThinkingChunk,
    ToolCallChunk,
    ToolCallDeltaChunk,
    Usage,
)
from exo_core.ids import InstanceId, ModelId, NodeId, TaskId, new_id
from exo_core.image_inputs import ImageInputError, check_images, inline_image_urls
from exo_core.images import ImageRequest, InvalidImageRequest, validate_image_request
from exo_core.model_cards import Capability, ModelCard, ModelTask
from exo_core.start_model import PlacingNode
from exo_core.state import Instance, RunnerStatus, State, Task
from exo_core.tool_arguments import CallCoercion
from exo_core.validation import FieldNames, ParamError, check_params

if TYPE_CHECKING:
    from exo_core.bodies import BodyStore
    from exo_core.chunks import ChunkRouter
    from exo_core.metrics import NodeMetrics
    from exo_core.parsers import OutputParser


class ServingNode(PlacingNode, Protocol):
    """What the generation service uses of its node (the node implements it)."""

    @property
    def node_id(self) -> NodeId: ...
    @property
    def router(self) -> ChunkRouter: ...
    @property
    def bodies(self) -> BodyStore: ...
    @property
    def metrics(self) -> NodeMetrics: ...
    def parser_for(self, card: ModelCard, params: GenerationParams) -> OutputParser | None: ...


class GenerationError(Exception):
    """A request that cannot be served; `status` is the HTTP status a dialect should answer."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(GenerationError):
    """A request the caller must change; `param` is the field at fault, when one is."""

    status = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(GenerationError):
    """The model id names no model card (404)."""

    status = 404


class NoInstance(GenerationError):
    status = 503


def validate(card: ModelCard, params: GenerationParams, names: FieldNames | None = None) -> None:
    """Refuse what the model cannot do, with a message that says what is wrong; `names` are
    the dialect's names for the fields (see `exo_core.validation`)."""
    if ModelTask.TEXT_GENERATION not in card.tasks:
        raise InvalidRequest(
            f"model '{card.model_id}' generates images, not text; use the image routes "
            "(POST /v1/images/generations)"
        )
    if not params.messages and params.prompt is None:
        raise InvalidRequest("the request has no messages")
    try:
        check_params(card, params, names)
    except ParamError as e:
        raise InvalidRequest(str(e), param=e.field) from e
    if any(m.has_images() for m in params.messages):
        if not card.has(Capability.VISION):
            raise InvalidRequest(f"model '{card.model_id}' does not accept images")
        try:
            check_images(params)
        except ImageInputError as e:
            raise InvalidRequest(str(e)) from e


# The shape of the ids exo hands out (`task-3f9c...`, `chatcmpl-...`, `resp_...`, `msg_...`).
_ISSUED_ID = re.compile(r"[A-Za-z]+[-_][0-9a-f]{12,32}")
# How long a cancel waits for a generation that another node may be submitting right now.
CANCEL_GRACE_S = 2.0


def may_be_issued(request_id: str) -> bool:
    """Whether `request_id` has the shape of an id exo issues (others are unknown at once)."""
    return _ISSUED_ID.fullmatch(request_id) is not None


class TaskProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Where a generation this node's API streams has got: denoising step `step` of `total`.

    Kept in memory on the node whose API holds the request (its chunks arrive there), never
    logged: a step every second would grow the replicated log for nothing it decides."""

    task_id: TaskId
    model_id: ModelId
    instance_id: InstanceId
    request_id: str | None
    step: int
    total: int
    index: int
    updated: float


def _unknown_here(state: State, model_id: str) -> str:
    """Why a model is unknown here: a plugin's card exists only on the nodes that have the
    plugin (until an instance of it is placed by a master that lacks it, which replicates it),
    so say which nodes serve it and with which engines."""
    serving = [
        n for n in state.nodes.values() if n.resources.serves and model_id in n.resources.serves
    ]
    if not serving:
        return f"model '{model_id}' is not known to this cluster"
    nodes = ", ".join(n.node_id for n in serving)
    engines = ", ".join(sorted({e for n in serving for e in n.resources.engines}))
    return (
        f"model '{model_id}' comes from a plugin this node lacks: node(s) {nodes} serve it "
        f"(engine {engines}); send the request there, or install that plugin on this node"
    )


class GenerationService:
    """The node's generation service: resolves a model id, places an instance when
    needed, runs a generation and streams its chunks, counts tokens, cancels by request id."""

    def __init__(self, node: ServingNode, keepalive_s: float = 10.0) -> None:
        self._node = node
        self._keepalive_s = keepalive_s
        self._placing: dict[ModelId, anyio.Lock] = {}
        # The generations this node's API is streaming, by the id their response carries (and
        # by task id), from before their task reaches the state: `POST /v1/cancel/{id}` on this
        # node reaches them at once; other nodes find them in the state (`Task.request_id`).
        self._streaming: dict[str, TaskId] = {}
        self._progress: dict[TaskId, TaskProgress] = {}

    def resolve(self, model_id: str) -> ModelCard:
        card = self._node.card(model_id)
        if card is None:
            raise ModelNotFound(_unknown_here(self._node.state, model_id))
        return card

    async def instance_for(self, card: ModelCard) -> Instance:
        """A running instance of the model; places one when allowed and none exists."""
        lock = self._placing.setdefault(card.model_id, anyio.Lock())
        async with lock:
            found = self._best_instance(card.model_id)
            if found is not None:
                return found
            if not self._node.config.auto_place:
                raise NoInstance(
                    f"model '{card.model_id}' has no running instance; "
                    "place one with POST /instance (auto-placement is off)"
                )
            # Placement reads which engines each node runs from state: wait for this node's
            # first report rather than refuse a model its own engine serves.
            await self._node.wait_reported()
            excluded = tuple(NodeId(n) for n in self._node.config.exclude_nodes)
            place = PlaceInstance(model_id=card.model_id, card=card, exclude_nodes=excluded)
            result = await self._node.send_command(place)
            if not result.ok or result.instance_id is None:
                raise NoInstance(f"could not place '{card.model_id}': {result.message}")
            await self._node.replica.wait_for(result.last_index, timeout=10)
            instance = self._node.state.instances.get(result.instance_id)
            if instance is None:
                raise NoInstance(f"the new instance of '{card.model_id}' is already gone")
            return instance

    def _best_instance(self, model_id: ModelId) -> Instance | None:
        state = self._node.state
        candidates = [i for i in state.instances.values() if i.model_id == model_id]

        def ready(instance: Instance) -> bool:
            runners = [state.runners.get(s.runner_id) for s in instance.shards]
            return all(r is not None and r.status == RunnerStatus.READY for r in runners)

        candidates.sort(key=lambda i: (not ready(i), i.instance_id))
        return candidates[0] if candidates else None

    async def generate(
        self,
        model_id: str,
        params: GenerationParams,
        names: FieldNames | None = None,
        *,
        request_id: str | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream a generation. Raises `GenerationError` before the first chunk when refused;
        `names` are the dialect's names for the fields a refusal names.

        `request_id` is the id the dialect's response carries (a chat completion id, say):
        `cancel(request_id)` then ends the generation from anywhere on this node.

        Use it as `async with aclosing(service.generate(...)) as chunks`, so that leaving early
        cancels the task at once."""
        card = self.resolve(model_id)
        if card.has(Capability.VISION) and any(m.has_images() for m in params.messages):
            try:
                params = await inline_image_urls(params)
            except ImageInputError as e:
                raise InvalidRequest(str(e)) from e
        validate(card, params, names)
        instance = await self.instance_for(card)
        return self._stream(card, instance.instance_id, params, request_id=request_id)

    async def count_tokens(self, model_id: str, params: GenerationParams) -> int:
        """The exact prompt tokens of a request, as the model's runner tokenizes it (chat
        template and tools included). Places the model when needed, like a generation."""
        counting = msgspec.structs.replace(params, count_only=True, max_tokens=None)
        async with aclosing(await self.generate(model_id, counting)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, FinishChunk):
                    return chunk.usage.prompt_tokens
                if isinstance(chunk, ErrorChunk):
                    raise NoInstance(f"counting tokens failed: {chunk.message}")
        raise NoInstance("counting tokens ended without an answer")

    def progress(self) -> list[TaskProgress]:
        """The latest step of each generation this node's API is streaming that reports steps."""
        return sorted(self._progress.values(), key=lambda p: p.task_id)

    def _task_for(self, request_id: str) -> TaskId | None:
        local = self._streaming.get(request_id)
        if local is not None:
            return local
        for task in self._node.state.tasks.values():
            if request_id in (task.task_id, task.request_id):
                return task.task_id
        return None

    async def cancel(self, request_id: str) -> bool:
        """Cancel a running generation, whichever node's API streams it, by its response id or
        task id. False when unknown.

        A response can carry its id a moment before its task reaches this node's state: an id
        of exo's shape that is not found yet is looked for again as the state changes, for
        `CANCEL_GRACE_S`."""
        task_id = self._task_for(request_id)
        if task_id is None and may_be_issued(request_id):
            with anyio.move_on_after(CANCEL_GRACE_S):
                while task_id is None:
                    await self._node.replica.wait_change()
                    task_id = self._task_for(request_id)
        if task_id is None:
            return False
        result = await self._node.send_command(CancelTask(task_id=task_id), timeout=10)
        if result.ok:
            await self._node.replica.wait_for(result.last_index, timeout=5)
        return result.ok

    async def generate_images(
        self, model_id: str, request: ImageRequest, *, request_id: str | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """Stream an image generation (progress, partial and final images, then a finish).

        Raises `GenerationError` before the first chunk when refused; leaving early cancels,
        and so does `cancel(request_id)`."""
        card = self.resolve(model_id)
        try:
            validate_image_request(card, request)
        except InvalidImageRequest as e:
            raise InvalidRequest(str(e)) from None
        instance = await self.instance_for(card)
        return self._stream(
            card, instance.instance_id, GenerationParams(), image=request, request_id=request_id
        )

    async def _stream(
        self,
        card: ModelCard,
        instance_id: InstanceId,
        params: GenerationParams,
        image: ImageRequest | None = None,
        request_id: str | None = None,
    ) -> AsyncGenerator[Chunk, None]:
        node = self._node
        task = Task(
            task_id=TaskId(new_id("task")),
            instance_id=instance_id,
            model_id=card.model_id,
            origin_node=node.node_id,
            params=params,
            image=image,
            request_id=request_id,
        )
        chunks = node.router.open(task.task_id, instance_id)
        ids = {task.task_id, *([request_id] if request_id else [])}
        self._streaming.update(dict.fromkeys(ids, task.task_id))
        node.bodies.hold(task)  # rank 0 fetches it from here; the log never sees it
        parser = node.parser_for(card, params) if image is None else None
        coercion = CallCoercion(params.tools)  # tool calls typed as the request's schemas
        done = False
        called_tools = False
        timing = _Timing()
        try:
            result = await node.send_command(SubmitTask(task=without_body(task)))
            if not result.ok:
                done = True
                yield ErrorChunk(task_id=task.task_id, message=result.message)
                return
            while True:
                chunk: Chunk | None = None
                with anyio.move_on_after(self._keepalive_s):
                    chunk = await chunks.receive()
                if chunk is None:
                    yield KeepAliveChunk(task_id=task.task_id)
                    continue
                if isinstance(chunk, TextChunk) and parser is not None:
                    parsed = parser.feed(chunk)
                elif isinstance(chunk, FinishChunk | ErrorChunk):
                    parsed = [*(parser.finish(task.task_id) if parser else []), chunk]
                else:
                    parsed = [chunk]
                parsed = [out for piece in parsed for out in coercion.feed(piece)]
                for piece in parsed:
                    if isinstance(piece, ProgressChunk):
                        self._progress[task.task_id] = TaskProgress(
                            task_id=task.task_id,
                            model_id=card.model_id,
                            instance_id=instance_id,
                            request_id=request_id,
                            step=piece.step,
                            total=piece.total,
                            index=piece.index,
                            updated=time.time(),
                        )
                    if isinstance(
                        piece, TextChunk | ThinkingChunk | ToolCallChunk | ToolCallDeltaChunk
                    ):
                        timing.output()
                    if isinstance(piece, ToolCallChunk):
                        called_tools = True
                    if isinstance(piece, FinishChunk):
                        done = True
                        if called_tools and piece.finish_reason == FinishReason.STOP:
                            piece = msgspec.structs.replace(
                                piece, finish_reason=FinishReason.TOOL_CALLS
                            )
                        if not params.count_only:
                            self._account(card, piece.finish_reason, piece.usage, timing)
                    if isinstance(piece, ErrorChunk):
                        done = True
                        self._account(card, FinishReason.ERROR, Usage(), timing)
                    yield piece
                if done:
                    return
        finally:
            node.router.close(task.task_id)
            self._progress.pop(task.task_id, None)
            for key in ids:
                self._streaming.pop(key, None)
            node.bodies.release(task.task_id)
            if not done:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    try:
                        await node.send_command(CancelTask(task_id=task.task_id), timeout=5)
                    except Exception as e:
                        logger.debug(f"cancel of {task.task_id} not sent: {e!r}")

    def _account(
        self, card: ModelCard, reason: FinishReason, usage: Usage, timing: _Timing
    ) -> None:
        self._node.metrics.observe_generation(
            card.model_id,
            reason,
            usage,
            first_output_s=timing.first,
            last_output_s=timing.last,
        )


class _Timing:
    """When a generation's first and last outputs reached the API, in seconds since submission."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None

    def output(self) -> None:
        self.last = time.perf_counter() - self.started
        if self.first is None:
            self.first = self.last
