"""What a plugin sees of the node it runs in: `NodeContext`, a deliberately narrow protocol.

Hooks receive it as `ctx`, route handlers as the injected `node`. The node implements it; tests
may pass any object with these members. Anything not listed here is the core's business and may
change without notice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from exo_core.commands import Command, CommandResult
    from exo_core.config import NodeConfig
    from exo_core.downloads import Downloader
    from exo_core.ids import ModelId, NodeId
    from exo_core.model_cards import ModelCard
    from exo_core.state import State

Job = Callable[[], Coroutine[Any, Any, Any]]
"""A background job: an async function taking no arguments (bind them with functools.partial)."""


# runtime_checkable: Litestar checks an injected value against the handler's annotation.
@runtime_checkable
class NodeContext(Protocol):
    """What a plugin sees of the node: its id and config, the cluster state, commands and
    background work."""

    @property
    def node_id(self) -> NodeId:
        """This node's id (stable across restarts)."""
        ...

    @property
    def config(self) -> NodeConfig:
        """The node's configuration; options plugins added are in `config.plugin_options`."""
        ...

    @property
    def state(self) -> State:
        """The cluster state as this node has applied it (frozen; replaced on every event)."""
        ...

    @property
    def started_at(self) -> float:
        """When this node started (seconds since the epoch)."""
        ...

    @property
    def downloader(self) -> Downloader | None:
        """The downloader a plugin provided, if any."""
        ...

    def card(self, model_id: str) -> ModelCard | None:
        """The model card for `model_id`: a custom card from state, else a built-in card."""
        ...

    def cards(self) -> dict[ModelId, ModelCard]:
        """Every model card this node knows."""
        ...

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Have the master run `command`; waits through elections up to `timeout` seconds."""
        ...

    async def run_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Like `send_command`, then wait (up to `timeout` again) until this node has applied
        the command's events, so that `state` shows their effect."""
        ...

    async def download(self, card: ModelCard) -> None:
        """Fetch `card`'s model to this node without running it; progress shows in
        `state.downloads`. Raises `DownloadFailed` (and RuntimeError on a node with no worker)."""
        ...

    def spawn(self, job: Job) -> None:
        """Run `job` in the background while the node runs. A job that raises is logged with
        the plugin's name and dropped; it never stops the node."""
        ...


class PluginContext:
    """The `NodeContext` the node hands its plugins: these members and nothing more, so that a
    plugin cannot come to rely on the core's insides (`ctx.replica`, `ctx.master`)."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        config: NodeConfig,
        state: Callable[[], State],
        started_at: float,
        downloader: Downloader | None,
        card: Callable[[str], ModelCard | None],
        cards: Callable[[], dict[ModelId, ModelCard]],
        send_command: Callable[[Command, float], Awaitable[CommandResult]],
        run_command: Callable[[Command, float], Awaitable[CommandResult]],
        download: Callable[[ModelCard], Awaitable[None]],
        spawn: Callable[[Job], None],
    ) -> None:
        self._node_id = node_id
        self._config = config
        self._state = state
        self._started_at = started_at
        self._downloader = downloader
        self._card = card
        self._cards = cards
        self._send_command = send_command
        self._run_command = run_command
        self._download = download
        self._spawn = spawn

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    @property
    def config(self) -> NodeConfig:
        return self._config

    @property
    def state(self) -> State:
        return self._state()

    @property
    def started_at(self) -> float:
        return self._started_at

    @property
    def downloader(self) -> Downloader | None:
        return self._downloader

    def card(self, model_id: str) -> ModelCard | None:
        return self._card(model_id)

    def cards(self) -> dict[ModelId, ModelCard]:
        return self._cards()

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        return await self._send_command(command, timeout)

    async def run_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        return await self._run_command(command, timeout)

    async def download(self, card: ModelCard) -> None:
        await self._download(card)

    def spawn(self, job: Job) -> None:
        self._spawn(job)
