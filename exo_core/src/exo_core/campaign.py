"""This node's part in elections: what it campaigns with, how it votes, how it takes over as
master (catch up, win a majority of votes, start the term) and its duties while it leads.

The election itself (who runs when) is `exo_core.election`; the votes are kept durably by
`exo_core.votes`; reading peers' answers and catching up are the peer protocol's
(`exo_core.peers`), reached through the narrow callables given here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import anyio
from loguru import logger

from exo_core.config import NodeConfig
from exo_core.context import Job
from exo_core.decide import MasterContext, decide_node_timeout
from exo_core.election import Election, ElectionTiming, is_majority
from exo_core.events import IndexedEvent
from exo_core.ids import NodeId
from exo_core.master import Master
from exo_core.metrics import NodeMetrics
from exo_core.peer_auth import is_member, vote_refusal
from exo_core.replica import Replica
from exo_core.transport.base import Transport, TransportError
from exo_core.votes import VoteBook
from exo_core.wire import (
    ELECTION_TOPIC,
    EVENTS_TOPIC,
    Campaign,
    EventBatch,
    Response,
    Vote,
    VoteRequest,
    encode,
)

NODE_TIMEOUT_S = 30.0


class Campaigner:
    """Runs this node's campaigns and, once it wins, its master; `master` is None while it
    follows."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        config: NodeConfig,
        priority: int,
        replica: Replica,
        votes: VoteBook,
        transport: Transport,
        metrics: NodeMetrics,
        timing: ElectionTiming,
        master_context: Callable[[], MasterContext],
        sync_from: Callable[[NodeId, float], Awaitable[bool]],
        decode_answer: Callable[[str, bytes], Response | None],
        follow: Callable[[], None],
        start_soon: Callable[[Job], None],
    ) -> None:
        self._node_id = node_id
        self._config = config
        self._priority = priority
        self._replica = replica
        self._votes = votes
        self._transport = transport
        self._metrics = metrics
        self._master_context = master_context
        self._sync_from = sync_from
        self._decode_answer = decode_answer
        self._on_follow = follow
        self._start_soon = start_soon
        self.master: Master | None = None
        self.election = Election(
            me=self.campaign,
            broadcast=self._broadcast,
            become_master=self._run_for_master,
            follow=self._follow,
            step_down=self._step_down,
            timing=timing,
            expect_peers=bool(config.bootstrap_peers),
            eligible=lambda node_id: is_member(node_id, replica.state),
        )

    def campaign(self) -> Campaign:
        state = self._replica.state
        node = state.nodes.get(self._node_id)
        return Campaign(
            node_id=self._node_id,
            term=self.master.term if self.master else self._replica.last_term,
            force_master=self._config.force_master,
            priority=self._priority,
            seniority=node.joined_index if node else 1 << 62,
            commands_seen=self._replica.next_index,
            is_master=self.master is not None,
            members=len({*state.nodes, self._node_id}),
            voted_term=self._votes.term,
            voted_for=self._votes.voted_for,
        )

    async def _broadcast(self, campaign: Campaign) -> None:
        await self._transport.publish(ELECTION_TOPIC, encode(campaign))

    async def _publish_events(
        self, events: tuple[IndexedEvent, ...], prev_term: int, committed: int
    ) -> None:
        batch = EventBatch(events=events, prev_term=prev_term, committed=committed)
        try:
            await self._transport.publish(EVENTS_TOPIC, encode(batch))
        except TransportError as e:
            # Followers notice on their next catch-up and fetch by request.
            logger.debug(f"event broadcast failed: {e}")

    def vote(self, request: VoteRequest, sender: str) -> Vote:
        # A master is its own live master: it votes for nobody else while it leads.
        live = self._node_id if self.master is not None else self.election.live_master()
        may_lead = self.election.may_lead(request.candidate)
        refusal = vote_refusal(sender, request, live, may_lead=may_lead)
        if refusal is not None:
            return Vote(granted=False, reason=refusal)
        replica = self._replica
        vote = self._votes.decide(request, replica.last_term, replica.state.last_index)
        if vote.granted and self.master is not None:
            logger.info(f"stepping down: voted for {request.candidate} in term {request.term}")
            self.master = None
        return vote

    def _vote_request(self, term: int) -> VoteRequest:
        return VoteRequest(
            term=term,
            candidate=self._node_id,
            last_term=self._replica.last_term,
            last_index=self._replica.state.last_index,
        )

    async def _gather_votes(self, term: int) -> bool:
        """Ask every peer for its vote in `term`; True with a majority of the members."""
        me = self._vote_request(term)
        if not self.vote(me, self._node_id).granted:
            return False
        granted = 1
        members = self.election.cluster_size(self.campaign())

        async def ask(peer: str) -> None:
            nonlocal granted
            try:
                raw = await self._transport.request(peer, encode(me), timeout=1.0)
            except TransportError:
                return
            answer = self._decode_answer(peer, raw)
            if isinstance(answer, Vote) and answer.granted:
                granted += 1
                if is_majority(granted, members):
                    # Won: a dead peer's request must not hold the failover up (the master
                    # asks the rest for their votes in its term later).
                    tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for peer in self._transport.peers():
                tg.start_soon(ask, peer)
        if not is_majority(granted, members):
            logger.info(f"term {term}: {granted} of {members} votes, not a majority")
            return False
        return True

    async def _run_for_master(self, term: int) -> bool:
        won = await self._become_master(term)
        self._metrics.campaigns.labels("won" if won else "lost").inc()
        return won

    async def _become_master(self, term: int) -> bool:
        """Take over: catch up from the most complete log in reach, win a majority of votes,
        then start the term."""
        me = self.campaign()
        state = self._replica.state
        # Only a member's log is worth copying (an outsider could claim any log).
        members = [c for c in self.election.alive() if is_member(c.node_id, state)]
        best = max(members, key=lambda c: (c.term, c.commands_seen), default=None)
        if (
            best is not None
            and best.node_id != self._node_id
            and (best.term, best.commands_seen) > (me.term, me.commands_seen)
        ):
            logger.info(f"catching up from {best.node_id} before taking over")
            if not await self._sync_from(best.node_id, 10):
                return False
        if not await self._gather_votes(term):
            return False
        ctx = self._master_context()
        master = Master(self._node_id, term, self._replica, ctx, self._publish_events)
        master.known_nodes(self._replica.state.nodes)
        self.master = master
        await master.start()
        self._start_soon(lambda: self._master_duties(master))
        return True

    async def _follow(self, master: NodeId, term: int) -> None:
        logger.info(f"following master {master} (term {term})")
        self._on_follow()

    async def _step_down(self) -> None:
        self.master = None

    async def _master_duties(self, master: Master) -> None:
        """Time out silent nodes while this node is master, and ask for missing votes."""
        while self.master is master:
            await anyio.sleep(1.0)
            await self._ask_missing_votes(master)
            for node_id in master.silent_nodes(NODE_TIMEOUT_S, exclude=self._node_id):
                logger.warning(f"node {node_id} unseen for {NODE_TIMEOUT_S:.0f}s: timing it out")
                ctx = self._master_context()
                await master.commit(decide_node_timeout(self._replica.state, node_id, ctx))

    async def _ask_missing_votes(self, master: Master) -> None:
        """A node follows a master its own vote backs (or a majority's announced votes): ask
        those that have not voted in our term (they joined later, or were out of reach during
        the election) for their vote."""
        voted = {c.node_id for c in self.election.alive() if c.voted_term == master.term}
        missing = [p for p in self._transport.peers() if p not in voted]
        if not missing:
            return
        request = self._vote_request(master.term)

        async def ask(peer: str) -> None:
            with contextlib.suppress(TransportError):
                await self._transport.request(peer, encode(request), timeout=1.0)

        async with anyio.create_task_group() as tg:
            for peer in missing:
                tg.start_soon(ask, peer)
