"""The hooks a plugin may implement. This module is the plugin API's reference.

A plugin is a module (or object) with functions marked `@hookimpl` and named like the specs
below, found through the entry point group `exo.plugins`::

    # pyproject.toml
    [project.entry-points."exo.plugins"]
    my_plugin = "my_package.plugin"

    # my_package/plugin.py
    from exo_core.plugin import hookimpl

    @hookimpl
    def exo_routes(ctx):
        return [my_litestar_router]

Hooks are called with keyword arguments, so an implementation declares only the arguments it
uses. Unless a hook says "first result wins", every implementation is called and the results
are collected in a list (None results are dropped).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from exo_core.config import NodeConfig
    from exo_core.context import NodeContext
    from exo_core.downloads import Downloader
    from exo_core.engine import Engine
    from exo_core.events import IndexedEvent
    from exo_core.model_cards import ModelCard
    from exo_core.parsers import ParserFactory
    from exo_core.placement_types import PlacementOption, PlacementRequest
    from exo_core.state import State
    from exo_core.transport.base import Transport

PROJECT = "exo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's function as the implementation of the hook it is named after."""


# -- Start-up: called once while the node starts --------------------------------------------------


@hookspec
def exo_model_cards(config: NodeConfig) -> list[ModelCard] | None:
    """Contribute built-in model cards.

    Called once at startup. Cards with the same id as an earlier one replace it; custom cards
    added through the API (replicated in state) take precedence over all of them.

    Since API 1.0.
    """


@hookspec
def exo_output_parsers() -> dict[str, ParserFactory] | None:
    """Register output parsers by name (thinking blocks, tool calls).

    Called once at startup. A model card selects parsers by its `reasoning_parser` and
    `tool_parser` fields. A factory is called per generation with (card, params).

    Since API 1.0.
    """


@hookspec
def exo_engines(config: NodeConfig) -> list[Engine] | Engine | None:
    """Provide inference engines.

    Called once at startup. Return one `exo_core.plugin.engine.Engine` or a list. The worker asks
    each engine, in order, whether it `can_serve` a model card and uses the first that can.

    Since API 1.0.
    """


@hookspec(firstresult=True)
def exo_transport(config: NodeConfig) -> Transport | None:
    """Provide this node's transport. First result wins.

    Called once at startup. Return an unstarted `exo_core.plugin.transport.Transport`, or None when
    this plugin's transport was not chosen (see `config.transport`). When no plugin provides
    one, the node runs alone on the core's in-memory transport.

    Since API 1.0.
    """


@hookspec(firstresult=True)
def exo_downloader(config: NodeConfig, node_id: str) -> Downloader | None:
    """Provide the model downloader. First result wins.

    Called once at startup, with this node's id (progress reports name it). Return an
    `exo_core.plugin.download.Downloader`. Without one, a node can run only models that an engine
    prepares itself (`Engine.prepare_model`) or that need none (`Engine.needs_download`).

    Since API 1.0.
    """


@hookspec
def exo_election_priority(config: NodeConfig) -> int | None:
    """Weigh this node in master elections. Results are summed; higher wins ties of term.

    Called once at startup; the sum weighs each of the node's campaigns. Use it to prefer, for
    example, a node on mains power.

    Since API 1.0.
    """


@hookspec
def exo_routes(ctx: NodeContext) -> list[Any] | None:
    """Contribute HTTP routes to the node's API.

    Called once when the API app is built. `ctx` gives access to the node (state, commands,
    generation). Return Litestar route handlers or `Router`s; a dialect plugin usually returns
    one `Router` with its own exception handlers so that errors come back in its wire format.

    Since API 1.0.
    """


# -- Serving: called while the node serves, on the cluster's decisions ----------------------------


@hookspec(firstresult=True)
def exo_place_instance(
    card: ModelCard, request: PlacementRequest, state: State
) -> list[PlacementOption] | None:
    """Place an instance of a model: list every valid placement, best first. First result wins.

    Called by the master for `POST /instance`, previews and auto-placement. Raise
    `exo_core.plugin.PlacementRefused` with the failed constraint when nothing fits.
    The core's default is registered `trylast`, so a plugin's implementation runs first and may
    return None to defer to it.

    Since API 1.0.
    """


# -- Observing: called for what happens in the cluster --------------------------------------------


@hookspec
def exo_event_applied(event: IndexedEvent, state: State, ctx: NodeContext) -> None:
    """Observe an event just applied to the local state (`state` is the state after it).

    Called on the node's event loop for every applied event, with the node that applied it:
    it must return quickly and never block (start work with `ctx.spawn`). Exceptions are
    logged and ignored.

    Since API 1.0.
    """


# -- CLI: called while the `exo` command line is built --------------------------------------------


@hookspec
def exo_add_cli_options(parser: argparse.ArgumentParser) -> None:
    """Add options to the `exo` command line.

    Called while the parser is built. Values reach plugins as `config.plugin_options[dest]`.

    Since API 1.0.
    """


@hookspec
def exo_cli_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add subcommands to `exo` (such as `exo import-gguf`).

    Called while the parser is built. Set a `func` default on the subparser: it is called with
    the parsed `argparse.Namespace` and returns the exit status.

    Since API 1.0.
    """


PHASES: dict[str, tuple[str, ...]] = {
    "start-up": (
        "exo_model_cards",
        "exo_output_parsers",
        "exo_engines",
        "exo_transport",
        "exo_downloader",
        "exo_election_priority",
        "exo_routes",
    ),
    "serving": ("exo_place_instance",),
    "observing": ("exo_event_applied",),
    "cli": (
        "exo_add_cli_options",
        "exo_cli_commands",
    ),
}
"""The hooks by the phase of the node's life in which they are called."""

ADDED_IN: dict[str, str] = {
    "exo_model_cards": "1.0",
    "exo_output_parsers": "1.0",
    "exo_engines": "1.0",
    "exo_transport": "1.0",
    "exo_downloader": "1.0",
    "exo_routes": "1.0",
    "exo_place_instance": "1.0",
    "exo_election_priority": "1.0",
    "exo_event_applied": "1.0",
    "exo_add_cli_options": "1.0",
    "exo_cli_commands": "1.0",
}
"""The plugin API version that added each hook (`exo_core.plugin.API_VERSION`)."""
