"""Hook implementations of the download_hf plugin.

The hooks are module functions (the entry point registers this module), so per-node state
lives on each node's downloader. `exo_event_applied` is not told which node calls it, so
nodes whose API is bound are kept in a process-wide map by node id: a DownloadDeleted for
node N is acted on by N's downloader, whichever node's replica applied it first.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from loguru import logger

from exo_core.commands import ReportEvents
from exo_core.events import DownloadDeleted, DownloadProgressed, IndexedEvent
from exo_core.hookspecs import hookimpl
from exo_core.ids import NodeId
from exo_core.model_cards import ModelCard
from exo_core.state import State
from exo_download_hf.cards import HubRef, builtin_cards, ref_for
from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.hub import HubClient
from exo_download_hf.routes import router

if TYPE_CHECKING:
    from exo_core.config import NodeConfig
    from exo_core.node import Node

_nodes: weakref.WeakValueDictionary[NodeId, Node] = weakref.WeakValueDictionary()
# The last event each node acted on: in a process running several nodes, every node applies
# the same event, but its target acts once.
_acted: weakref.WeakKeyDictionary[Node, int] = weakref.WeakKeyDictionary()
# Tasks started from the event hook, kept alive until they finish.
_tasks: set[asyncio.Task[None]] = set()


def _node_id_file(config: NodeConfig) -> NodeId | None:
    """The in-memory transport keeps the node id in the data directory; other transports make
    theirs, so the id is learnt for sure only when the node binds the API (exo_routes)."""
    path = config.data_path / "node_id"
    try:
        return NodeId(path.read_text().strip()) or None
    except OSError:
        return None


@hookimpl
def exo_downloader(config: NodeConfig) -> HfDownloader:
    return HfDownloader(
        ModelDirs.from_env(config.models_dir),
        HubClient(),
        offline=config.offline,
        node_id=_node_id_file(config),
    )


@hookimpl
def exo_model_cards() -> list[ModelCard]:
    return builtin_cards()


@hookimpl
def exo_routes(ctx: Node) -> list[Any]:
    downloader = ctx.downloader
    if isinstance(downloader, HfDownloader):
        downloader.node_id = ctx.node_id
        _nodes[ctx.node_id] = ctx
    return [router()]


@hookimpl
def exo_event_applied(event: IndexedEvent, state: State) -> None:
    match event.event:
        case DownloadDeleted(node_id=node_id, model_id=model_id):
            node = _nodes.get(node_id)
            downloader = node.downloader if node is not None else None
            if node is None or not isinstance(downloader, HfDownloader):
                return
            if _acted.get(node, -1) >= event.index:
                return
            _acted[node] = event.index
            card = node.card(model_id)
            ref = ref_for(model_id, card)
            if ref is None:
                return
            # The hook must not block: the deletion runs as a task of the node's loop.
            task = asyncio.get_running_loop().create_task(
                _delete_requested(node, downloader, card, ref)
            )
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
        case _:
            pass


async def _delete_requested(
    node: Node, downloader: HfDownloader, card: ModelCard | None, ref: HubRef
) -> None:
    """Another node asked (through the log) that this node delete a model."""
    try:
        await downloader.delete_ref(ref)
        kept = downloader.find_ref(ref)
        if kept is None or card is None:
            return
        # It is still here, in a read-only directory: say so again, since the event removed it
        # from state.
        progress = downloader.completed(card, kept)
        await node.send_command(ReportEvents(events=(DownloadProgressed(progress=progress),)))
        logger.warning(f"{ref.repo_id} is in the read-only directory {kept}: not deleted")
    except Exception:
        logger.exception(f"deleting {ref.repo_id} on request failed")
