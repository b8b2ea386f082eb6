"""HTTP routes of the native API for models: add and remove custom cards, search the hub,
delete downloads. Errors are native: `{"status_code": N, "detail": "..."}`.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote

import msgspec
from litestar import Request, Response, Router, delete, get, post
from litestar.params import FromPath, JSONBody, QueryParameter
from loguru import logger

from exo_core.plugin import InjectedNode, ModelId, NodeContext, NodeId, UnsafeModelPath
from exo_core.plugin.cards import instances_using, model_id_problem
from exo_core.plugin.dialect import native_error
from exo_core.plugin.download import AddModelCard, DeleteDownload, DownloadFailed, RemoveModelCard
from exo_download_hf.cards import CardError, card_from_config, ref_for
from exo_download_hf.chat_format import ChatFormat, detect
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.hub import LOOKUP_TIMEOUT_S, HubClient, HubError, RepoSnapshot
from exo_download_hf.lookups import HubLookups

# A hub repo id: `name` or `org/name`, ASCII letters, digits, `-`, `_`, `.` (the hub's further
# rules are `hub.check_repo_id`'s).
REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$", re.ASCII)
# How long an API call waits for its own event to be applied locally, so that the next read
# (GET /models) already sees it.


class AddModelBody(msgspec.Struct, forbid_unknown_fields=True):
    model_id: str


def _hub(node: NodeContext) -> HubClient:
    downloader = node.downloader
    return downloader.hub if isinstance(downloader, HfDownloader) else HubClient()


# For a node whose downloader is not this plugin's (its routes still search the hub).
_OTHER_LOOKUPS = HubLookups()


def _lookups(node: NodeContext) -> HubLookups:
    """The node's own pool for hub look-ups (see `exo_download_hf.lookups`)."""
    downloader = node.downloader
    return downloader.lookups if isinstance(downloader, HfDownloader) else _OTHER_LOOKUPS


def _offline(node: NodeContext) -> Response[Any] | None:
    if node.config.offline:
        return native_error(409, "this node runs with --offline: it does not call the hub")
    return None


def _raw_model_id(request: Request[Any, Any, Any], skip: int) -> str:
    """The model id in the request's path after its first `skip` parts, percent-decoded once.

    Taken from the raw path, because the router drops empty parts (`//etc` would arrive as
    `etc`), and decoded once only (`%252E` stays `%2E`, which the check then refuses)."""
    raw = request.scope.get("raw_path", b"") or request.url.path.encode()
    return unquote("/".join(raw.decode("latin-1").split("/")[skip + 1 :]))


def _refuse_unsafe(model_id: str) -> Response[Any] | None:
    problem = model_id_problem(model_id)
    if problem is None:
        return None
    return native_error(422, f"'{model_id}' is not a valid model id: {problem}")


def _chat_format(hub: HubClient, snapshot: RepoSnapshot) -> ChatFormat:
    """The parsers and capabilities the repo's tokenizer files show; none when it has none
    (a repo without a tokenizer config, or one that is not JSON, still gets its card)."""
    names = {f.path for f in snapshot.files}
    config: Any = {}
    if "tokenizer_config.json" in names:
        with contextlib.suppress(HubError):
            config = hub.read_json(snapshot.repo_id, "tokenizer_config.json", snapshot.commit)
    template = None
    if "chat_template.jinja" in names:
        with contextlib.suppress(HubError):
            template = hub.read_text(snapshot.repo_id, "chat_template.jinja", snapshot.commit)
    return detect(config if isinstance(config, dict) else {}, template)


@post("/models/add", status_code=201)
async def add_model(node: InjectedNode, data: JSONBody[AddModelBody]) -> Response[Any]:
    repo_id = data.model_id.strip()
    if (refused := _refuse_unsafe(repo_id)) is not None:
        return refused
    if not REPO_ID.match(repo_id):
        return native_error(422, f"'{data.model_id}' is not a hub repo id (org/name)")
    if (refused := _offline(node)) is not None:
        return refused
    existing = node.card(repo_id)
    if existing is not None and not existing.custom:
        return native_error(409, f"{repo_id} is a built-in model already")
    hub = _hub(node)

    def build() -> Any:
        snapshot = hub.snapshot(repo_id, timeout=LOOKUP_TIMEOUT_S)
        config = hub.read_json(repo_id, "config.json", snapshot.commit)
        if not isinstance(config, dict):
            raise CardError(f"{repo_id}: config.json is not a JSON object")
        return card_from_config(repo_id, config, snapshot.files, _chat_format(hub, snapshot))

    try:
        card = await _lookups(node).run(f"adding {repo_id}", build)
    except HubError as e:
        return native_error(e.status, str(e))
    except CardError as e:
        return native_error(422, str(e))
    result = await node.run_command(AddModelCard(card=card))
    if not result.ok:
        return native_error(result.status, result.message)
    return Response(msgspec.to_builtins(card), status_code=201)


@delete("/models/custom/{model_id:path}", status_code=200)
async def remove_model(node: InjectedNode, request: Request[Any, Any, Any]) -> Response[Any]:
    model_id = _raw_model_id(request, skip=2)
    if (refused := _refuse_unsafe(model_id)) is not None:
        return refused
    result = await node.run_command(RemoveModelCard(model_id=ModelId(model_id)))
    if not result.ok:
        return native_error(result.status, result.message)
    return Response({"model_id": model_id, "deleted": True})


@get("/models/search")
async def search_models(
    node: InjectedNode,
    # `query` is a name Litestar reserves (the whole query string), hence the alias.
    text: Annotated[str, QueryParameter(name="query")] = "",
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
) -> Response[Any]:
    if (refused := _offline(node)) is not None:
        return refused
    hub = _hub(node)
    try:
        found = await _lookups(node).run(f"search '{text}'", lambda: hub.search(text, limit))
    except HubError as e:
        return native_error(e.status, str(e))
    known = node.cards()
    models = [
        {
            "model_id": m.id,
            "downloads": m.downloads,
            "likes": m.likes,
            "tags": m.tags or [],
            "pipeline_tag": m.pipeline_tag,
            "library_name": m.library_name,
            "added": m.id in known,
        }
        for m in found
    ]
    return Response({"query": text, "models": models})


@post("/download/{node_id:str}/{model_id:path}", status_code=202)
async def start_download(
    node: InjectedNode, node_id: FromPath[str], model_id: FromPath[str]
) -> Response[Any]:
    """Download a model to this node (without running it); progress shows in
    `state.downloads[<this node>][<model>]`."""
    model_id = model_id.strip("/")
    if node_id != node.node_id:
        return native_error(
            409, f"this is node {node.node_id}: ask {node_id}'s own API to download there"
        )
    card = node.card(model_id)
    if card is None:
        return native_error(404, f"unknown model '{model_id}'")
    if not node.config.worker:
        return native_error(409, "this node runs no worker (--no-worker): it keeps no models")
    if not node.config.downloads:
        return native_error(409, "this node runs with --no-downloads: it downloads no models")

    async def fetch() -> None:
        try:
            await node.download(card)
        except DownloadFailed as e:
            logger.warning(f"download of {model_id} failed: {e}")

    node.spawn(fetch)
    return Response({"node_id": node.node_id, "model_id": model_id}, status_code=202)


@delete("/download/{node_id:str}/{model_id:path}", status_code=200)
async def delete_download(
    node: InjectedNode, node_id: FromPath[str], request: Request[Any, Any, Any]
) -> Response[Any]:
    model_id = _raw_model_id(request, skip=2)
    if (refused := _refuse_unsafe(model_id)) is not None:
        return refused
    state = node.state
    if node_id not in state.nodes and node_id != node.node_id:
        return native_error(404, f"unknown node '{node_id}'")
    # By id, folder name or hub repo: every name that reaches the model's folder.
    in_use = instances_using(state, NodeId(node_id), model_id, node.card)
    if in_use:
        return native_error(
            409,
            f"{model_id} is in use on {node_id} by instance {', '.join(in_use)}; "
            "delete the instance first",
        )
    command = DeleteDownload(node_id=NodeId(node_id), model_id=ModelId(model_id))
    if node_id != node.node_id:
        copy = state.downloads.get(NodeId(node_id), {}).get(ModelId(model_id))
        if copy is not None and copy.read_only:
            return _read_only(model_id, copy.path, node_id)
        # That node deletes its files when it applies the event (see the plugin's
        # exo_event_applied); a read-only copy it had not reported yet, it keeps and reports.
        result = await node.run_command(command)
        if not result.ok:
            return native_error(result.status, result.message)
        body = {"node_id": node_id, "model_id": model_id, "deleted": False, "requested": True}
        return Response(body, status_code=202)
    downloader = node.downloader
    if not isinstance(downloader, HfDownloader):
        return native_error(501, "this node's downloader is not the hub downloader")
    ref = ref_for(model_id, node.card(model_id))
    if ref is None:
        return native_error(404, f"{model_id} does not come from the hub: nothing to delete")
    try:
        downloader.dirs.writable_candidates(ref.repo_id)
    except UnsafeModelPath as e:
        return native_error(422, f"not deleting {model_id}: {e}")
    found = downloader.find_ref(ref)
    if found is not None and downloader.dirs.is_read_only(found):
        return _read_only(model_id, str(found), node_id)
    deleted = await downloader.delete_ref(ref)
    reported = NodeId(node_id) in state.downloads and model_id in state.downloads[NodeId(node_id)]
    if not deleted and not reported:
        return native_error(404, f"{model_id} is not downloaded on {node_id}")
    await node.run_command(command)
    return Response({"node_id": node_id, "model_id": model_id, "deleted": deleted})


def _read_only(model_id: str, path: str | None, node_id: str) -> Response[Any]:
    where = f"the read-only directory {Path(path).parent}" if path else "a read-only directory"
    return native_error(
        409,
        f"{model_id} is in {where} on {node_id} (EXO_MODELS_READ_ONLY_DIRS): "
        "exo never deletes from it",
    )


def router() -> Router:
    return Router(
        path="/",
        route_handlers=[add_model, remove_model, search_models, start_download, delete_download],
        tags=["models"],
    )
