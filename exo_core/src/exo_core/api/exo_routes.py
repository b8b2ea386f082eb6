"""exo's own instance routes, with exo's request bodies and answers (`exo_shapes`), as thin
translations to the commands and placement the native API uses: `POST /place_instance`,
`GET /instance/placement`, `GET /instance/await`, `GET /v1/feature-flags`. Errors are the
native API's (`{"status_code": N, "detail": "..."}`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
import msgspec
from litestar import Controller, Response, get, post
from litestar.params import FromQuery, JSONBody, Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from exo_core.api.errors import native_error
from exo_core.api.exo_shapes import (
    ExoInstanceMeta,
    ExoSharding,
    exo_card,
    exo_instance,
    instance_meta_problem,
    our_sharding,
)
from exo_core.api.native import NodeDep
from exo_core.decide import build_instance
from exo_core.ids import InstanceId, ModelId, NodeId, new_id
from exo_core.node import Node
from exo_core.placement_types import PlacementRefused, PlacementRequest
from exo_core.start_model import place_model
from exo_core.state import Instance

# exo's `await_instance` bound on `timeout_seconds` (0: wait until one exists).
MAX_AWAIT_S = 300.0
KEEPALIVE_S = 15.0


class ExoPlaceInstanceBody(msgspec.Struct, forbid_unknown_fields=True):
    """exo's `PlaceInstanceParams` (plus the `node_ids` its previews take)."""

    model_id: str
    sharding: ExoSharding = "Pipeline"
    instance_meta: ExoInstanceMeta = "MlxRing"
    min_nodes: int = 1
    node_ids: list[str] | None = None


def _request_problem(
    node: Node, model_id: str, instance_meta: ExoInstanceMeta, min_nodes: int, node_ids: list[str]
) -> Response[Any] | None:
    """The 4xx for a placement exo's clients ask for that cannot be asked here, or None."""
    if node.card(model_id) is None:
        return native_error(404, f"unknown model '{model_id}' (GET /v1/models lists them)")
    if (meta_problem := instance_meta_problem(instance_meta)) is not None:
        return native_error(400, meta_problem)
    if min_nodes < 1:
        return native_error(422, "min_nodes must be at least 1")
    unknown = [n for n in node_ids if n not in node.state.nodes]
    if unknown:
        return native_error(404, f"unknown node '{unknown[0]}' in node_ids")
    return None


class ExoRoutesController(Controller):
    tags = ["native", "exo"]

    @post("/place_instance", status_code=200)
    async def place_instance(
        self, node: NodeDep, data: JSONBody[ExoPlaceInstanceBody]
    ) -> Response[Any]:
        """Place an instance as exo does; answers once the master has placed it."""
        node_ids = data.node_ids or []
        problem = _request_problem(
            node, data.model_id, data.instance_meta, data.min_nodes, node_ids
        )
        if problem is not None:
            return problem
        card = node.card(data.model_id)
        assert card is not None  # checked above
        result = await place_model(
            node,
            data.model_id,
            our_sharding(data.sharding),
            data.min_nodes,
            node_ids=tuple(NodeId(n) for n in node_ids),
        )
        if not result.ok or result.instance_id is None:
            return native_error(result.status, result.message)
        await node.replica.wait_for(result.last_index, timeout=5)
        body = {
            "message": "Command received.",
            "command_id": result.command_id,
            "model_card": exo_card(card),
            "instance_id": result.instance_id,
        }
        return Response(body, status_code=200)

    @get("/instance/placement")
    async def placement(
        self,
        node: NodeDep,
        model_id: FromQuery[str],
        sharding: FromQuery[ExoSharding] = "Pipeline",
        instance_meta: FromQuery[ExoInstanceMeta] = "MlxRing",
        min_nodes: FromQuery[int] = 1,
    ) -> Response[Any]:
        """The instance exo would create (not created): exo's tagged `MlxRingInstance`."""
        problem = _request_problem(node, model_id, instance_meta, min_nodes, [])
        if problem is not None:
            return problem
        card = node.card(model_id)
        assert card is not None
        request = PlacementRequest(
            model_id=ModelId(model_id), sharding=our_sharding(sharding), min_nodes=min_nodes
        )
        try:
            options = node.place_options(request)
        except PlacementRefused as e:
            return native_error(400, f"cannot place {model_id}: {e}")
        if not options:
            return native_error(400, f"cannot place {model_id}: no placement fits")
        instance = build_instance(node.state, options[0], InstanceId(new_id("inst")))
        return Response(exo_instance(instance, card))

    @get("/instance/await")
    async def await_instance(
        self,
        node: NodeDep,
        model_id: FromQuery[str],
        timeout_seconds: Annotated[float, Parameter(ge=0, le=MAX_AWAIT_S)] = 0.0,
    ) -> Response[Any] | ServerSentEvent:
        """Server-sent events: one `{"type": "ready", "instance": ...}` once an instance of
        the model exists (now or later), or `{"type": "timeout", ...}` after `timeout_seconds`
        (0: no limit), as exo answers."""
        card = node.card(model_id)
        if card is None:
            return native_error(404, f"unknown model '{model_id}' (GET /v1/models lists them)")
        if not math.isfinite(timeout_seconds):
            return native_error(422, "timeout_seconds must be a number of seconds")

        def found() -> Instance | None:
            return next((i for i in node.state.instances.values() if i.model_id == model_id), None)

        async def stream() -> AsyncIterator[ServerSentEventMessage]:
            deadline = anyio.current_time() + (timeout_seconds or math.inf)
            while (instance := found()) is None:
                left = deadline - anyio.current_time()
                if left <= 0:
                    body = {"type": "timeout", "message": f"No instance found for model {model_id}"}
                    yield ServerSentEventMessage(data=msgspec.json.encode(body).decode())
                    return
                with anyio.move_on_after(min(left, KEEPALIVE_S)):
                    await node.replica.wait_change()
                if found() is None and anyio.current_time() < deadline:
                    yield ServerSentEventMessage(comment="keep-alive")  # proxies keep it open
            ready = {"type": "ready", "instance": exo_instance(instance, card)}
            yield ServerSentEventMessage(data=msgspec.json.encode(ready).decode())

        return ServerSentEvent(stream(), headers={"Cache-Control": "no-cache"})

    @get("/v1/feature-flags")
    async def feature_flags(self) -> dict[str, bool]:
        """exo's flags: prefill/decode disaggregation does not exist here."""
        return {"disaggregation": False}
