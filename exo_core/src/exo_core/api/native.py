"""The native API: cluster state, events, models and instances. Keys are snake_case."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio.lowlevel
import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException, ValidationException
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.response import ServerSentEvent, ServerSentEventMessage
from loguru import logger

from exo_core.api.dialect import documented_body
from exo_core.api.errors import native_error
from exo_core.api.exo_shapes import (
    ExoInstanceMeta,
    ExoSharding,
    instance_meta_problem,
    our_sharding,
)
from exo_core.commands import DeleteInstance
from exo_core.ids import InstanceId, ModelId, NodeId
from exo_core.metrics import CONTENT_TYPE_LATEST
from exo_core.node import Node
from exo_core.placement_types import PlacementRefused, PlacementRequest
from exo_core.start_model import place_model
from exo_core.state import DownloadStatus, Sharding

NodeDep = NamedDependency[Node]


class PlaceInstanceBody(msgspec.Struct, forbid_unknown_fields=True):
    model_id: str
    # exo's spellings ("Pipeline", "Tensor") too, and its other fields: exo's body works here.
    sharding: Sharding | ExoSharding = "pipeline"
    min_nodes: int = 1
    # Pin the instance to these nodes (all when empty); never place it on the excluded ones
    # (this node's --exclude-node list is added).
    nodes: list[str] = msgspec.field(default_factory=list)
    exclude_nodes: list[str] = msgspec.field(default_factory=list)
    instance_meta: ExoInstanceMeta = "MlxRing"
    # exo's field: nodes the placement must include.
    node_ids: list[str] | None = None


class CancelBody(msgspec.Struct):
    """No fields: the id to cancel is in the path (a body, if any, is ignored)."""


class InstanceCreatedBody(msgspec.Struct):
    instance_id: str
    model_id: str
    event_index: int


def _subtree(value: Any, path: str) -> Any:
    for part in (p for p in path.split("/") if p):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise NotFoundException(f"state has no path '{path}' (no '{part}')")
    return value


EVENTS_BATCH = 1000


def _events_error(cursor: int, next_index: int) -> ServerSentEventMessage:
    message = (
        f"the event log holds no readable event at index {cursor} "
        f"(it should hold up to {next_index - 1}); the stream ends here"
    )
    logger.error(f"/events: {message}")
    return ServerSentEventMessage(
        data=msgspec.json.encode({"error": message, "index": cursor}).decode(), event="error"
    )


class NativeController(Controller):
    tags = ["native"]

    @get("/node_id")
    async def node_id(self, node: NodeDep) -> dict[str, str]:
        return {"node_id": node.node_id}

    @get("/healthz")
    async def healthz(self, node: NodeDep) -> dict[str, Any]:
        state = node.state
        return {
            "status": "ok",
            "node_id": node.node_id,
            "master": state.master.node_id if state.master else None,
            "last_index": state.last_index,
        }

    @get("/state")
    async def state(self, node: NodeDep) -> Response[bytes]:
        return Response(msgspec.json.encode(node.state), media_type="application/json")

    @get("/state/{path:path}")
    async def state_path(self, node: NodeDep, path: FromPath[str]) -> Response[bytes]:
        value = _subtree(msgspec.to_builtins(node.state), path)
        return Response(msgspec.json.encode(value), media_type="application/json")

    @get("/progress")
    async def progress(self, node: NodeDep) -> Response[bytes]:
        """The latest denoising step of each image generation this node's API is streaming
        (held in memory here, not in the replicated state: steps would grow the log)."""
        body = {"tasks": node.generation.progress()}
        return Response(msgspec.json.encode(body), media_type="application/json")

    @get("/events")
    async def events(self, node: NodeDep, since: FromQuery[int] = 0) -> ServerSentEvent:
        """Indexed events from `since` on, then live, as server-sent events (id = index).

        Events the log has cut behind a snapshot come as one `snapshot` message instead: the
        state after them (id = the index of the last event it holds)."""
        if since < 0:
            raise ValidationException("since must not be negative")

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            cursor = since
            replica = node.replica
            while True:
                while cursor < replica.next_index:
                    snapshot = replica.snapshot
                    if cursor < replica.first_index and snapshot is not None:
                        yield ServerSentEventMessage(
                            data=msgspec.json.encode(snapshot.state).decode(),
                            event="snapshot",
                            id=str(snapshot.last_index),
                        )
                        cursor = snapshot.next_index
                        continue
                    batch = replica.log.read(cursor, cursor + EVENTS_BATCH)
                    if not batch or batch[0].index != cursor:
                        # The log does not hold what its index promises (damaged on disk?):
                        # say so and end, rather than ask again and again.
                        yield _events_error(cursor, replica.next_index)
                        return
                    for event in batch:
                        yield ServerSentEventMessage(
                            data=msgspec.json.encode(event).decode(),
                            event="event",
                            id=str(event.index),
                        )
                        cursor = event.index + 1
                    await anyio.lowlevel.checkpoint()  # other requests run between batches
                await replica.wait_change()

        return ServerSentEvent(stream())

    @get("/models")
    async def models(
        self, node: NodeDep, status: FromQuery[Literal["downloaded"] | None] = None
    ) -> dict[str, Any]:
        state = node.state
        out = []
        for card in node.cards().values():
            downloads = {
                node_id: msgspec.to_builtins(per_model[card.model_id])
                for node_id, per_model in state.downloads.items()
                if card.model_id in per_model
            }
            downloaded = any(d["status"] == DownloadStatus.COMPLETED for d in downloads.values())
            if status == "downloaded" and not downloaded:
                continue
            out.append({**msgspec.to_builtins(card), "downloads": downloads})
        return {"models": out}

    @post("/instance", status_code=201)
    async def place_instance(
        self, node: NodeDep, data: JSONBody[PlaceInstanceBody]
    ) -> Response[Any]:
        if data.min_nodes < 1:
            raise ValidationException("min_nodes must be at least 1")
        if (meta_problem := instance_meta_problem(data.instance_meta)) is not None:
            return native_error(400, meta_problem)
        unknown = [n for n in data.node_ids or [] if n not in node.state.nodes]
        if unknown:
            return native_error(404, f"unknown node '{unknown[0]}' in node_ids")
        result = await place_model(
            node,
            data.model_id,
            our_sharding(data.sharding),
            data.min_nodes,
            node_ids=tuple(NodeId(n) for n in data.node_ids or []),
            nodes=tuple(NodeId(n) for n in data.nodes),
            exclude_nodes=tuple(NodeId(n) for n in data.exclude_nodes),
        )
        if not result.ok or result.instance_id is None:
            return native_error(result.status, result.message)
        await node.replica.wait_for(result.last_index, timeout=5)
        body = InstanceCreatedBody(
            instance_id=result.instance_id, model_id=data.model_id, event_index=result.last_index
        )
        return Response(body, status_code=201)

    @get("/instance/previews")
    async def previews(
        self,
        node: NodeDep,
        model_id: FromQuery[str],
        sharding: FromQuery[Sharding | None] = None,
        min_nodes: FromQuery[int] = 1,
        node_ids: FromQuery[list[str] | None] = None,
    ) -> Response[Any]:
        """Where the model could run; with `node_ids` (repeated), only placements that
        include every one of those nodes."""
        if node.card(model_id) is None:
            return native_error(404, f"unknown model '{model_id}'")
        unknown = [n for n in node_ids or [] if n not in node.state.nodes]
        if unknown:
            return native_error(404, f"unknown node '{unknown[0]}' in node_ids")
        request = PlacementRequest(
            model_id=ModelId(model_id),
            sharding=sharding,
            min_nodes=min_nodes,
            node_ids=tuple(NodeId(n) for n in node_ids or []),
        )
        try:
            options = node.place_options(request)
        except PlacementRefused as e:
            return Response({"model_id": model_id, "previews": [], "refused": str(e)})
        previews = [
            {
                "sharding": o.sharding,
                "nodes": [
                    {
                        "node_id": s.node_id,
                        "start_layer": s.start_layer,
                        "end_layer": s.end_layer,
                        "memory_bytes": s.memory_bytes,
                    }
                    for s in o.shares
                ],
            }
            for o in options
        ]
        return Response({"model_id": model_id, "previews": previews, "refused": None})

    @get("/instance/{instance_id:str}")
    async def get_instance(self, node: NodeDep, instance_id: FromPath[str]) -> Any:
        state = node.state
        instance = state.instances.get(InstanceId(instance_id))
        if instance is None:
            raise NotFoundException(f"unknown instance '{instance_id}'")
        runners = {
            s.runner_id: msgspec.to_builtins(state.runners[s.runner_id])
            for s in instance.shards
            if s.runner_id in state.runners
        }
        return {**msgspec.to_builtins(instance), "runners": runners}

    @delete("/instance/{instance_id:str}", status_code=200)
    async def delete_instance(self, node: NodeDep, instance_id: FromPath[str]) -> Response[Any]:
        result = await node.send_command(DeleteInstance(instance_id=InstanceId(instance_id)))
        if not result.ok:
            return native_error(result.status, result.message)
        await node.replica.wait_for(result.last_index, timeout=5)
        return Response({"instance_id": instance_id, "deleted": True})

    @post(
        "/v1/cancel/{command_id:str}",
        status_code=200,
        dependencies=documented_body(CancelBody),
    )
    async def cancel(self, node: NodeDep, command_id: FromPath[str]) -> Response[Any]:
        """Cancel a running generation by the id its response carries (or its task id)."""
        if not await node.generation.cancel(command_id):
            return native_error(404, f"no running generation '{command_id}'")
        return Response({"message": "Command cancelled.", "command_id": command_id})

    @get("/metrics")
    async def metrics(self, node: NodeDep) -> Response[bytes]:
        """Prometheus text exposition: this node, and the whole cluster on the master."""
        return Response(node.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @get("/plugins")
    async def plugins(self, node: NodeDep, request: Request) -> dict[str, Any]:
        return {
            "plugins": [msgspec.to_builtins(p) for p in node.plugins.plugins()],
            "failed": [msgspec.to_builtins(f) for f in node.plugins.failures],
            "disabled": node.plugins.disabled,
            "warnings": node.plugins.warnings,
        }
