"""Hook implementations of the download_hf plugin.

The hooks are module functions (the entry point registers this module) and keep no state of
their own: each node's state lives on its downloader, and `exo_event_applied` is handed the node
that applied the event, so in a process running several nodes each acts for itself.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from loguru import logger

from exo_core.plugin import IndexedEvent, ModelCard, NodeContext, NodeId, State, hookimpl
from exo_core.plugin.cards import instances_using, is_safe_model_id
from exo_core.plugin.download import (
    DownloadDeleted,
    DownloadProgress,
    DownloadProgressed,
    DownloadStatus,
    ReportEvents,
)
from exo_download_hf import exo_download_routes
from exo_download_hf.cards import HubRef, builtin_cards, ref_for
from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.hub import HubClient
from exo_download_hf.routes import router

if TYPE_CHECKING:
    from exo_core.plugin import NodeConfig


@hookimpl
def exo_downloader(config: NodeConfig, node_id: str) -> HfDownloader:
    return HfDownloader(
        ModelDirs.from_env(config.models_dir),
        HubClient(),
        offline=config.offline,
        node_id=NodeId(node_id),
    )


@hookimpl
def exo_model_cards() -> list[ModelCard]:
    return builtin_cards()


@hookimpl
def exo_routes() -> list[Any]:
    return [router(), exo_download_routes.router()]


@hookimpl
def exo_event_applied(event: IndexedEvent, state: State, ctx: NodeContext) -> None:
    downloader = ctx.downloader
    if not isinstance(downloader, HfDownloader):
        return
    match event.event:
        case DownloadDeleted(node_id=node_id, model_id=model_id) if node_id == ctx.node_id:
            card = ctx.card(model_id)
            ref = ref_for(model_id, card)
            # Checked again here, whatever the master let through: an id that could lead out
            # of the models directories deletes nothing.
            unsafe = [
                n for n in (model_id, ref.repo_id if ref else "") if n and not is_safe_model_id(n)
            ]
            # And whatever name it came under, a model a runner here uses stays (the master
            # checks too, from state; this node knows its runners' folders for certain).
            in_use = instances_using(state, ctx.node_id, model_id, ctx.card)
            if unsafe:
                logger.warning(f"refusing to delete the download of '{unsafe[0]}': unsafe model id")
            elif in_use:
                logger.warning(
                    f"refusing to delete '{model_id}': instance {', '.join(in_use)} uses it"
                )
            elif ref is not None:
                # The hook must not block: the deletion runs in the node's task group.
                ctx.spawn(partial(_delete_requested, ctx, downloader, card, ref))
        case DownloadProgressed(progress=p) if p.node_id == ctx.node_id:
            if _unmarked_read_only(downloader, p):
                # Reported without the mark (the worker reports what it finds on disk and
                # does not know our directories): say it again, marked, so that other nodes
                # refuse to ask for its deletion.
                marked = msgspec.structs.replace(p, read_only=True)
                ctx.spawn(partial(_report, ctx, marked))
        case _:
            pass


def _unmarked_read_only(downloader: HfDownloader, p: DownloadProgress) -> bool:
    return (
        p.status == DownloadStatus.COMPLETED
        and p.path is not None
        and not p.read_only
        and downloader.dirs.is_read_only(Path(p.path))
    )


async def _report(node: NodeContext, progress: DownloadProgress) -> None:
    # Jobs run in the node's task group: an exception escaping one would stop the node.
    try:
        await node.send_command(ReportEvents(events=(DownloadProgressed(progress=progress),)))
    except Exception:
        logger.exception(f"reporting {progress.model_id} failed")


async def _delete_requested(
    node: NodeContext, downloader: HfDownloader, card: ModelCard | None, ref: HubRef
) -> None:
    """Another node asked (through the log) that this node delete a model."""
    try:
        await downloader.delete_ref(ref)
        kept = downloader.find_ref(ref)
    except Exception:
        logger.exception(f"deleting {ref.repo_id} on request failed")
        return
    if kept is None or card is None:
        return
    # It is still here, in a read-only directory: say so again, since the event removed it from
    # state.
    logger.warning(f"{ref.repo_id} is in the read-only directory {kept}: not deleted")
    await _report(node, downloader.completed(card, kept))
