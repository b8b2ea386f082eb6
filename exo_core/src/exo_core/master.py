"""The master role: turns commands into indexed, durable, replicated events.

Only the elected master of a term runs one. Commands are decided one at a time, so the log's
order is the order of decisions. A command is acknowledged only once its events are durable
on a majority of the cluster's members, so that no acknowledged command is lost when the
master dies: any majority that elects the next master includes a node holding them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

import anyio
from loguru import logger

from exo_core.commands import CommandEnvelope, CommandResult
from exo_core.decide import CommandRefused, MasterContext, decide
from exo_core.eventlog import LogWriteFailed
from exo_core.events import Event, IndexedEvent, InstanceCreated, MasterElected
from exo_core.ids import CommandId, NodeId
from exo_core.replica import Replica

# (events, term of the event before them, commit index)
Publish = Callable[[tuple[IndexedEvent, ...], int, int], Awaitable[None]]
_REMEMBERED_COMMANDS = 10_000
REPLICATION_TIMEOUT_S = 10.0


def majority_index(acknowledged: list[int]) -> int:
    """The highest index held by a majority, given each member's highest durable index."""
    ranked = sorted(acknowledged, reverse=True)
    return ranked[len(ranked) // 2] if ranked else -1


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
        self._heard: dict[NodeId, float] = {}
        self._match: dict[NodeId, int] = {}
        self._first_index = replica.next_index
        self.commit_index = -1
        self._committed = anyio.Event()
        self.commands_seen = 0

    # -- membership and liveness --------------------------------------------------------------

    def members(self) -> set[NodeId]:
        return {*self._replica.state.nodes, self.node_id}

    def known_nodes(self, nodes: Mapping[NodeId, object]) -> None:
        """Start every known node's silence clock now (a new master has heard nobody yet)."""
        now = anyio.current_time()
        for node_id in nodes:
            self._heard.setdefault(node_id, now)

    def heard_from(self, node_id: NodeId) -> None:
        self._heard[node_id] = anyio.current_time()

    def silent_nodes(self, timeout: float, exclude: NodeId) -> list[NodeId]:
        """Nodes in state that sent nothing for `timeout` seconds."""
        now = anyio.current_time()
        return [
            n
            for n in self._replica.state.nodes
            if n != exclude and now - self._heard.setdefault(n, now) > timeout
        ]

    # -- replication --------------------------------------------------------------------------

    def replicated(self, node_id: NodeId, index: int, term: int) -> None:
        """A follower holds a log whose event `index` has `term`."""
        self.heard_from(node_id)
        if index < 0 or self._replica.term_at(index) != term:
            return  # its log is not ours up to there (yet)
        self._match[node_id] = max(self._match.get(node_id, -1), index)
        self._advance()

    def _advance(self) -> None:
        acknowledged = [
            self._replica.state.last_index if m == self.node_id else self._match.get(m, -1)
            for m in self.members()
        ]
        # Only events of our own term are counted, as in Raft: an older term's events are
        # committed implicitly by the first of ours.
        index = majority_index(acknowledged)
        if index >= self._first_index and index > self.commit_index:
            self.commit_index = index
            self._replica.mark_committed(index)
            self._committed.set()
            self._committed = anyio.Event()

    async def wait_committed(self, index: int, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            while self.commit_index < index:
                await self._committed.wait()
            return True
        return False

    # -- commands -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.commit([MasterElected(node_id=self.node_id, term=self.term)])
        logger.info(f"this node is master for term {self.term}")

    async def commit(self, events: list[Event]) -> int:
        """Index, persist, apply and broadcast events. Returns the last index."""
        async with self._lock:
            return await self._append(events)

    async def _append(self, events: list[Event], command_id: CommandId | None = None) -> int:
        start = self._replica.next_index
        prev_term = self._replica.term_at(start - 1)
        indexed = tuple(
            IndexedEvent(index=start + i, term=self.term, event=e, command_id=command_id)
            for i, e in enumerate(events)
        )
        self._replica.ingest(indexed, prev_term)
        self._advance()
        if indexed:
            await self._publish(indexed, prev_term, self.commit_index)
        return self._replica.state.last_index

    async def handle(self, envelope: CommandEnvelope) -> CommandResult:
        async with self._lock:
            # A retried command is answered as before and applies nothing again.
            result = self._results.get(envelope.command_id) or self._taken_before(envelope)
            if result is None:
                result = await self._decide(envelope)
                self._results[envelope.command_id] = result
                if len(self._results) > _REMEMBERED_COMMANDS:
                    self._results.popitem(last=False)
        if result.ok and not await self.wait_committed(result.last_index, REPLICATION_TIMEOUT_S):
            return CommandResult(
                command_id=envelope.command_id,
                status=503,
                message="the master could not replicate the command to a majority of the cluster",
            )
        return result

    def _taken_before(self, envelope: CommandEnvelope) -> CommandResult | None:
        """The result of a command an earlier master put in the log (its sender got no answer
        and asks again, now of us): the events it made, not a second set of them."""
        found = self._replica.command_events(envelope.command_id)
        if found is None:
            return None
        first, last = found
        created = (
            e.event.instance.instance_id
            for e in self._replica.log.read(first, last + 1)
            if isinstance(e.event, InstanceCreated)
        )
        return CommandResult(
            command_id=envelope.command_id, last_index=last, instance_id=next(created, None)
        )

    async def _decide(self, envelope: CommandEnvelope) -> CommandResult:
        self.commands_seen += 1
        try:
            decision = decide(self._replica.state, envelope.command, self._ctx)
        except CommandRefused as e:
            return CommandResult(command_id=envelope.command_id, status=e.status, message=e.message)
        try:
            last = await self._append(decision.events, envelope.command_id)
        except LogWriteFailed as e:  # a full disk: refuse this command, keep serving
            return CommandResult(command_id=envelope.command_id, status=507, message=str(e))
        return CommandResult(
            command_id=envelope.command_id, last_index=last, instance_id=decision.instance_id
        )
