"""exo's download routes, with exo's bodies and answers: `POST /download/start`
(`{target_node_id, shard_metadata}`) and `POST /download/cancel` (`{target_node_id,
model_id}`). exo's frozen models take and give camelCase keys (its dashboard sends
`targetNodeId`, `shardMetadata`), and also accept the snake_case names; both are read here.
The answer is exo's `{"commandId": ...}`.

A node fetches models for itself only: a target that is another node gets a 409 saying
which node's API to ask (as `POST /download/{node_id}/{model_id}` does).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, Router, post
from loguru import logger

from exo_core.plugin import InjectedNode, NodeContext, new_id
from exo_core.plugin.dialect import native_error
from exo_core.plugin.download import DownloadFailed
from exo_download_hf.downloader import HfDownloader

_START_FIELDS = {"target_node_id": "targetNodeId", "shard_metadata": "shardMetadata"}
_CANCEL_FIELDS = {"target_node_id": "targetNodeId", "model_id": "modelId"}


class BadBody(ValueError):
    """The body is not exo's; the message says what is wrong."""


def exo_fields(raw: bytes, names: dict[str, str]) -> dict[str, Any]:
    """The body's fields by their snake_case names, taking exo's camelCase aliases too;
    raises `BadBody` for a body that is not a JSON object, an unknown or missing field."""
    try:
        body = msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError as e:
        raise BadBody(f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadBody("the body must be a JSON object")
    aliases = {camel: snake for snake, camel in names.items()}
    fields: dict[str, Any] = {}
    for key, value in body.items():
        name = key if key in names else aliases.get(key)
        if name is None:
            raise BadBody(f"unknown field '{key}' (exo's body has {', '.join(names)})")
        fields[name] = value
    missing = [n for n in names if n not in fields]
    if missing:
        raise BadBody(f"{missing[0]} is required")
    return fields


def shard_model_id(shard_metadata: object) -> str | None:
    """The model id in exo's shard metadata (`{"PipelineShardMetadata": {"modelCard":
    {"modelId": ...}, ...}}`, tagged or not, either key style), or None."""
    inner = shard_metadata
    if isinstance(inner, dict) and len(inner) == 1:
        key = next(iter(inner))
        if isinstance(key, str) and key.endswith("ShardMetadata"):
            inner = inner[key]
    card = inner.get("modelCard", inner.get("model_card")) if isinstance(inner, dict) else None
    model_id = card.get("modelId", card.get("model_id")) if isinstance(card, dict) else None
    return model_id if isinstance(model_id, str) and model_id else None


def _target_problem(node: NodeContext, target: object) -> Response[Any] | None:
    if not isinstance(target, str) or not target:
        return native_error(422, "target_node_id must be a node id (GET /state lists nodes)")
    if target != node.node_id:
        return native_error(
            409, f"this is node {node.node_id}: ask {target}'s own API to download there"
        )
    if not node.config.worker:
        return native_error(409, "this node runs no worker (--no-worker): it keeps no models")
    return None


@post("/download/start", status_code=200)
async def start_download(node: InjectedNode, request: Request[Any, Any, Any]) -> Response[Any]:
    """Download a model to this node without running it (progress in `state.downloads`)."""
    try:
        fields = exo_fields(await request.body(), _START_FIELDS)
    except BadBody as e:
        return native_error(422, str(e))
    if (refused := _target_problem(node, fields["target_node_id"])) is not None:
        return refused
    model_id = shard_model_id(fields["shard_metadata"])
    if model_id is None:
        return native_error(422, "shard_metadata has no model_card.model_id")
    card = node.card(model_id)
    if card is None:
        return native_error(404, f"unknown model '{model_id}'")

    async def fetch() -> None:
        try:
            await node.download(card)
        except DownloadFailed as e:
            logger.warning(f"download of {model_id} failed: {e}")

    node.spawn(fetch)
    return Response({"commandId": new_id("cmd")})


@post("/download/cancel", status_code=200)
async def cancel_download(node: InjectedNode, request: Request[Any, Any, Any]) -> Response[Any]:
    """Stop this node's download of a model; what was fetched stays, and starting it again
    resumes. 404 when no download of it is running."""
    try:
        fields = exo_fields(await request.body(), _CANCEL_FIELDS)
    except BadBody as e:
        return native_error(422, str(e))
    if (refused := _target_problem(node, fields["target_node_id"])) is not None:
        return refused
    model_id = fields["model_id"]
    card = node.card(model_id) if isinstance(model_id, str) else None
    if card is None:
        return native_error(404, f"unknown model '{model_id}'")
    downloader = node.downloader
    if not isinstance(downloader, HfDownloader) or not downloader.cancel(card):
        return native_error(404, f"no download of {model_id} is running on {node.node_id}")
    return Response({"commandId": new_id("cmd")})


def router() -> Router:
    return Router(path="/", route_handlers=[start_download, cancel_download], tags=["models"])
