"""The node's telemetry: every few seconds (and at once when asked) it reports its resources,
the models it can serve and the peers it reaches, as events through the master."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

import anyio
from loguru import logger

from exo_core.commands import Command, CommandResult, ReportEvents
from exo_core.config import NodeConfig
from exo_core.downloads import needs_fetching
from exo_core.engine import Engine
from exo_core.events import NodeTelemetry, TopologyReported
from exo_core.ids import ModelId, NodeId, RunnerId
from exo_core.model_cards import ModelCard
from exo_core.plugin_host import describe
from exo_core.replica import Replica
from exo_core.telemetry import cap_memory, gather_resources, hostname, local_addresses
from exo_core.transport.base import TransportError

TELEMETRY_INTERVAL_S = 5.0
# How long a placement waits for a just-started node's first telemetry before placing anyway.
REPORT_WAIT_S = 30.0


class Reporter:
    """Sends this node's telemetry. `runner_pids` is None on a node without a worker: it runs
    no engine and serves nothing."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        config: NodeConfig,
        replica: Replica,
        engines: list[Engine],
        cards: Callable[[], dict[ModelId, ModelCard]],
        runner_pids: Callable[[], dict[RunnerId, int]] | None,
        peers: Callable[[], Iterable[str]],
        send_command: Callable[[Command, float], Awaitable[CommandResult]],
    ) -> None:
        self._node_id = node_id
        self._config = config
        self._replica = replica
        self._engines = engines
        self._cards = cards
        self._runner_pids = runner_pids
        self._peers = peers
        self._send_command = send_command
        self._report_now = anyio.Event()

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The engines this node runs, as its telemetry reports them (none without a worker)."""
        if self._runner_pids is None:
            return ()
        return tuple(sorted({e.name for e in self._engines if e.name}))

    def reported(self) -> bool:
        """Whether state holds this node with its engines: placement reads them from there."""
        known = self._replica.state.nodes.get(self._node_id)
        return not self.engine_names or (
            known is not None and set(self.engine_names) <= set(known.resources.engines)
        )

    async def wait_reported(self, timeout: float = REPORT_WAIT_S) -> bool:
        """Wait until `reported()`: a node that just started answers its API before its first
        telemetry is in state, and placing then would find no node with its engines."""
        with anyio.move_on_after(timeout):
            while not self.reported():
                await self._replica.wait_change()
            return True
        return False

    def servable(self) -> tuple[ModelId, ...]:
        """The known models that some local engine can serve (placement asks telemetry); with
        `--no-downloads`, of the hub's models only those already on this node's disk."""
        on_disk = self._replica.state.downloads.get(self._node_id, {})
        return tuple(
            sorted(
                m
                for m, card in self._cards().items()
                if any(_serves(e, card) for e in self._engines)
                and (self._config.downloads or not needs_fetching(card, on_disk.get(m)))
            )
        )

    def report_now(self) -> None:
        """Report at once, not at the next interval (what this node serves just changed)."""
        self._report_now.set()

    async def run(self) -> None:
        addresses = local_addresses(self._config.listen_host)
        while True:
            pids = self._runner_pids
            resources = cap_memory(
                gather_resources(
                    self._config.data_dir,
                    self.engine_names,
                    self.servable() if pids else (),
                    pids() if pids else None,
                ),
                self._config.max_memory,
            )
            report = ReportEvents(
                events=(
                    NodeTelemetry(
                        node_id=self._node_id,
                        hostname=hostname(),
                        addresses=addresses,
                        resources=resources,
                        timestamp=time.time(),
                    ),
                    TopologyReported(
                        node_id=self._node_id,
                        peers=tuple(sorted(NodeId(p) for p in self._peers())),
                    ),
                )
            )
            try:
                await self._send_command(report, 10)
            except (TimeoutError, TransportError) as e:
                logger.debug(f"telemetry not sent: {e!r}")
            with anyio.move_on_after(TELEMETRY_INTERVAL_S):
                await self._report_now.wait()
            self._report_now = anyio.Event()


def _serves(engine: Engine, card: ModelCard) -> bool:
    try:
        return engine.can_serve(card)
    except Exception as e:  # an engine plugin's bug: it serves nothing it fails on
        logger.debug(f"engine {engine.name}: can_serve({card.model_id}) raised {describe(e)}")
        return False
