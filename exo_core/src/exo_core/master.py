"""The master role: turns commands into indexed, durable, broadcast events.

Only the elected master of a term runs one. Commands are handled one at a time, so the log's
order is the order of decisions.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

import anyio
from loguru import logger

from exo_core.commands import CommandEnvelope, CommandResult
from exo_core.decide import CommandRefused, MasterContext, decide
from exo_core.events import Event, IndexedEvent, MasterElected
from exo_core.ids import CommandId, NodeId
from exo_core.replica import Replica

Publish = Callable[[tuple[IndexedEvent, ...]], Awaitable[None]]
_REMEMBERED_COMMANDS = 10_000


class Master:
    def __init__(
        self, node_id: NodeId, term: int, replica: Replica, ctx: MasterContext, publish: Publish
    ) -> None:
        self.node_id = node_id
        self.term = term
        self._replica = replica
        self._ctx = ctx
        self._publish = publish
        self._lock = anyio.Lock()
        self._results: OrderedDict[CommandId, CommandResult] = OrderedDict()
        self.commands_seen = 0
        self._heard: dict[NodeId, float] = {}

    def known_nodes(self, nodes: Mapping[NodeId, object]) -> None:
        """Start every known node's silence clock now (a new master has heard nobody yet)."""
        now = time.monotonic()
        for node_id in nodes:
            self._heard.setdefault(node_id, now)

    def heard_from(self, node_id: NodeId) -> None:
        self._heard[node_id] = time.monotonic()

    def silent_nodes(self, timeout: float, exclude: NodeId) -> list[NodeId]:
        """Nodes in state that sent nothing for `timeout` seconds."""
        now = time.monotonic()
        nodes = self._replica.state.nodes
        return [n for n in nodes if n != exclude and now - self._heard.setdefault(n, now) > timeout]

    async def start(self) -> None:
        await self.commit([MasterElected(node_id=self.node_id, term=self.term)])
        logger.info(f"this node is master for term {self.term}")

    async def commit(self, events: list[Event]) -> int:
        """Index, persist, apply and broadcast events. Returns the last index."""
        async with self._lock:
            return await self._commit_locked(events)

    async def _commit_locked(self, events: list[Event]) -> int:
        start = self._replica.next_index
        indexed = tuple(
            IndexedEvent(index=start + i, term=self.term, event=e) for i, e in enumerate(events)
        )
        self._replica.ingest(indexed)
        if indexed:
            await self._publish(indexed)
        return self._replica.state.last_index

    async def handle(self, envelope: CommandEnvelope) -> CommandResult:
        async with self._lock:
            if (done := self._results.get(envelope.command_id)) is not None:
                return done  # a retried command: answer as before, apply nothing again
            self.commands_seen += 1
            try:
                decision = decide(self._replica.state, envelope.command, self._ctx)
                last = await self._commit_locked(decision.events)
                result = CommandResult(
                    command_id=envelope.command_id,
                    last_index=last,
                    instance_id=decision.instance_id,
                )
            except CommandRefused as e:
                result = CommandResult(
                    command_id=envelope.command_id, status=e.status, message=e.message
                )
            self._results[envelope.command_id] = result
            if len(self._results) > _REMEMBERED_COMMANDS:
                self._results.popitem(last=False)
            return result
