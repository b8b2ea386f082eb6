"""What `exo plugins` runs: the start-up hooks that need no running node.

A node calls `exo_engines`, `exo_downloader`, `exo_model_cards`, `exo_output_parsers`,
`exo_election_priority` and `exo_routes` as it starts, and leaves out a plugin whose hook
raises (or whose routes Litestar refuses or another plugin has). `exo plugins` calls the same
hooks the same way, `exo_routes` against `OfflineContext`, so its listing shows the failures
`GET /plugins` would. Not called: `exo_transport` (it opens the node's identity and sockets)
and the hooks of a running node (observers, placement).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from litestar import Litestar
from litestar.di import Provide

from exo_core.api.routes_check import accepted_routes
from exo_core.commands import Command, CommandResult
from exo_core.config import NodeConfig
from exo_core.context import Job
from exo_core.downloads import Downloader
from exo_core.ids import ModelId, NodeId
from exo_core.model_cards import ModelCard
from exo_core.plugin_host import PluginHost
from exo_core.state import State

NO_NODE = "no node is running: `exo plugins` only checks the plugins"
CHECK_NODE_ID = NodeId("exo-plugins-check")


@dataclass
class OfflineContext:
    """A `NodeContext` with no node behind it: empty state, no cards, commands refused."""

    config: NodeConfig
    node_id: NodeId = CHECK_NODE_ID
    state: State = field(default_factory=State)
    started_at: float = field(default_factory=time.time)
    downloader: Downloader | None = None

    def card(self, model_id: str) -> ModelCard | None:
        return None

    def cards(self) -> dict[ModelId, ModelCard]:
        return {}

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        raise RuntimeError(NO_NODE)

    async def run_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        raise RuntimeError(NO_NODE)

    async def download(self, card: ModelCard) -> None:
        raise RuntimeError(NO_NODE)

    def spawn(self, job: Job) -> None:
        raise RuntimeError(NO_NODE)


def run_startup_hooks(plugins: PluginHost, config: NodeConfig) -> None:
    """Call the start-up hooks a node calls, as it calls them: a plugin that fails is left out
    and listed in `plugins.failures`."""
    ctx = OfflineContext(config)
    plugins.collect("exo_engines", config=config)
    ctx.downloader = plugins.first("exo_downloader", config=config, node_id=ctx.node_id)
    plugins.collect("exo_model_cards", config=config)
    plugins.collect("exo_output_parsers")
    plugins.collect("exo_election_priority", config=config)
    contributed = [(n, list(hs)) for n, hs in plugins.collect("exo_routes", ctx=ctx)]
    accepted_routes(plugins, contributed, lambda handlers: trial_app(ctx, handlers))


def trial_app(ctx: OfflineContext, handlers: list[Any]) -> Litestar:
    """An app with the node's dependency names, to see whether Litestar accepts `handlers`."""
    return Litestar(
        route_handlers=handlers,
        dependencies={
            "node": Provide(lambda: ctx, sync_to_thread=False),
            "generation": Provide(lambda: None, sync_to_thread=False),
        },
    )
