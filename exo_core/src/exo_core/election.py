"""Master election: deterministic, term based.

Every node broadcasts a `Campaign` twice a second. Among the nodes heard recently, the one with
the best key leads: `force_master`, then the highest term (the term of the last event in its
log), then election priority, then seniority, then the most commands seen, then node id. A node
that claims mastership with a higher term than ours is followed at once; a master that sees
such a claim steps down, so at most one master is accepted per term. With no live master, the
best candidate takes the next term after a short settling time (long enough to hear everyone),
and only while it hears a majority of the cluster's members: a minority could commit nothing.
Before it starts its term, the winner catches up from the most complete log it can reach.

Failover is event driven, not paced by the heartbeat: the loss of the followed master's
connection, the end of its `timeout` of silence and a new master's claim wake the loop at
once, a node that lost its master runs after `regroup` (not at the next beat), and a node
whose role changed announces it at once.
Campaigns are otherwise sent once per beat, so two claimants cannot wake each other in a loop.

A claim is only a claim: a node follows (or steps down for) a master only for a term in which
it voted for it, or which a majority of members announce they voted for
(`peer_auth.master_claim_backed`); the master asks nodes that did not vote (they joined later,
or were out of reach) for their vote in its term. No node votes while it follows (or is) a
live master, so nobody deposes a working master. Candidates are ranked among members of the cluster
(`eligible`): a peer that is not in the replicated state cannot make the members wait for it,
gets no member's vote while members are in reach (`may_lead`), and counts towards no majority.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from loguru import logger

from exo_core.ids import NodeId
from exo_core.peer_auth import master_claim_backed
from exo_core.terms import has_successor, next_term, term_round
from exo_core.wire import Campaign


@dataclass(frozen=True)
class ElectionTiming:
    heartbeat: float = 0.5
    # A node unheard for this long is out of the race (and a master unheard so long is lost).
    timeout: float = 2.0
    # How long a node listens before it may claim mastership.
    settle: float = 1.0
    # How long survivors wait after losing their master before the best of them runs: they
    # already hear each other, so this only lets them all notice the loss (a dropped
    # connection is noticed by every survivor within milliseconds on a LAN).
    regroup: float = 0.2
    # How long a node that was given peers to join waits for them before it runs alone.
    alone_grace: float = 5.0
    # How long the best survivor has to take over before the next in rank runs instead (and
    # so on, round the ranking): a candidate whose catch-up or vote requests keep failing
    # must not leave the others waiting for it forever.
    takeover: float = 4.0


_LATE_S = 0.001


def is_majority(count: int, members: int) -> bool:
    return count > members // 2


# How many election rounds a vote may run ahead of the master's term (elections that failed
# while a node was cut off); a vote beyond that is not believed.
MAX_ROUNDS_AHEAD = 1024


def plausible_later_vote(voted_term: int, term: int) -> bool:
    """Whether a vote in `voted_term` is newer than `term` and could be a real one."""
    return term < voted_term and term_round(voted_term) <= term_round(term) + MAX_ROUNDS_AHEAD


def rank_key(c: Campaign) -> tuple[bool, int, int, int, int, str]:
    return (c.force_master, c.term, c.priority, -c.seniority, c.commands_seen, c.node_id)


def candidate(pool: list[Campaign], failed_turns: int) -> Campaign:
    """Who should run now: the best in rank, or after `failed_turns` turns that brought no
    master, the next ones in rank, round robin (every survivor counts turns from its own loss
    of the master; they agree but near a turn's end, and votes settle that)."""
    ranked = sorted(pool, key=rank_key, reverse=True)
    if ranked[0].force_master:
        return ranked[0]  # the operator's choice waits for no one else
    return ranked[failed_turns % len(ranked)]


def new_term(current: int, pool: list[Campaign], node_id: NodeId) -> int:
    """The term `node_id` runs in: after this node's and every candidate's term and vote. A
    term with no successor on the wire is a hostile peer's claim (no honest vote is ever cast
    in one, see `exo_core.votes`), and running after it would leave no term to run in."""
    terms = [current, *(t for c in pool for t in (c.term, c.voted_term))]
    return next_term(max((t for t in terms if has_successor(t)), default=0), node_id)


class Election:
    def __init__(
        self,
        me: Callable[[], Campaign],
        broadcast: Callable[[Campaign], Awaitable[None]],
        become_master: Callable[[int], Awaitable[bool]],
        follow: Callable[[NodeId, int], Awaitable[None]],
        step_down: Callable[[], Awaitable[None]],
        timing: ElectionTiming = ElectionTiming(),
        expect_peers: bool = False,
        eligible: Callable[[NodeId], bool] = lambda node_id: True,
    ) -> None:
        self._expect_peers = expect_peers
        self._eligible = eligible
        self._me = me
        self._broadcast = broadcast
        self._become_master = become_master
        self._follow = follow
        self._step_down = step_down
        self.timing = timing
        self._heard: dict[NodeId, tuple[Campaign, float]] = {}
        self._started: float | None = None
        self._lost_master_at: float | None = None
        self._wake = anyio.Event()
        self._majority_at: float | None = None  # when this node last heard a majority
        self._busy = False  # in `evaluate` (which may be taking over)
        self._last_sent = float("-inf")
        self.master: NodeId | None = None
        self.term = 0

    def observe(self, campaign: Campaign) -> None:
        self._heard[campaign.node_id] = (campaign, anyio.current_time())
        if campaign.is_master and (campaign.node_id, campaign.term) != (self.master, self.term):
            self._wake.set()  # a new master's claim: follow it (or contest it) now

    def forget(self, node_id: NodeId) -> None:
        self._heard.pop(node_id, None)
        if node_id == self.master:
            self._wake.set()  # the master's connection dropped: start the failover now

    def _members_in_reach(self, me: Campaign) -> list[Campaign]:
        """The other members heard (`eligible`): an outsider's campaign counts towards no
        majority, and its claim of how many members the cluster has changes nothing."""
        others = [c for c in self._alive() if c.node_id != me.node_id]
        return [c for c in self.eligible([me, *others]) if c.node_id != me.node_id]

    def cluster_size(self, me: Campaign) -> int:
        """How many members the cluster has, as the best-informed member in reach knows it."""
        return max([me.members, *(c.members for c in self._members_in_reach(me))])

    def reach(self) -> tuple[int, int]:
        """How many members this node hears (itself included), and how many the cluster has."""
        me = self._me()
        return 1 + len(self._members_in_reach(me)), self.cluster_size(me)

    def cut_off_for(self) -> float:
        """Seconds since this node last heard a majority of the members (0 while it does)."""
        heard, members = self.reach()
        now = anyio.current_time()
        if is_majority(heard, members) or self._majority_at is None:
            self._majority_at = now
        return now - self._majority_at

    def alive(self) -> list[Campaign]:
        """Campaigns heard within the timeout."""
        return self._alive()

    def _alive(self) -> list[Campaign]:
        now = anyio.current_time()
        return [c for c, at in self._heard.values() if now - at < self.timing.timeout]

    def eligible(self, campaigns: list[Campaign]) -> list[Campaign]:
        """The campaigns of members (all of them when none is a member: a cluster being formed,
        or one whose known members are all gone)."""
        members = [c for c in campaigns if self._eligible(c.node_id)]
        return members or campaigns

    def may_lead(self, node_id: NodeId) -> bool:
        """Whether `node_id` may be a candidate (and get votes): a member, or anyone while no
        member is in reach (the rule of `eligible`)."""
        if self._eligible(node_id):
            return True
        return not any(self._eligible(c.node_id) for c in [self._me(), *self._alive()])

    def live_master(self) -> NodeId | None:
        """The other node this one follows as master, while it is heard claiming it."""
        heard = self._heard.get(self.master) if self.master is not None else None
        if heard is None or anyio.current_time() - heard[1] >= self.timing.timeout:
            return None
        campaign = heard[0]
        return campaign.node_id if campaign.is_master and campaign.term == self.term else None

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._beat_while_busy)
            await self._loop()

    async def _beat_while_busy(self) -> None:
        """Keep campaigning while `evaluate` waits on a takeover (its catch-up may take many
        seconds on a lossy link): a candidate that fell silent would count as gone, and the
        others, short of a majority without it, would all wait for it."""
        while True:
            await anyio.sleep(self.timing.heartbeat)
            if self._busy and anyio.current_time() - self._last_sent >= self.timing.heartbeat:
                await self._send(self._me())

    async def _loop(self) -> None:
        self._started = anyio.current_time()
        next_beat = self._started
        while True:
            me = self._me()
            if anyio.current_time() >= next_beat:
                await self._send(me)
                next_beat = anyio.current_time() + self.timing.heartbeat
            role = self.master, self.term, self._lost_master_at is None
            self._busy = True
            try:
                await self.evaluate(me)
            finally:
                self._busy = False
            if (self.master, self.term, self._lost_master_at is None) != role:
                # Announce a new role, or the loss of the master, without waiting a beat: the
                # survivors rank each other by fresh campaigns when `regroup` ends.
                await self._send(self._me())
            now = anyio.current_time()
            later = [self._master_expiry(), self._regroup_end()]
            wake_at = min([next_beat, *(t for t in later if t is not None and t > now)])
            # A hair late: a deadline computed as a sum of floats may land just short of the
            # `now - since < span` it is meant to pass.
            with anyio.move_on_after(max(0.0, wake_at - now) + _LATE_S):
                await self._wake.wait()
            self._wake = anyio.Event()

    def _master_expiry(self) -> float | None:
        """When the master we follow, silent since, counts as lost (a dead machine drops no
        connection: only its silence tells)."""
        heard = self._heard.get(self.master) if self.master is not None else None
        return None if heard is None else heard[1] + self.timing.timeout

    def _regroup_end(self) -> float | None:
        lost = self._lost_master_at
        return None if lost is None else lost + self.timing.regroup

    async def _send(self, me: Campaign) -> None:
        self._last_sent = anyio.current_time()
        try:
            await self._broadcast(me)
        except Exception as e:  # never let a broadcast failure stop elections
            logger.debug(f"campaign broadcast failed: {e!r}")

    async def evaluate(self, me: Campaign) -> None:
        now = anyio.current_time()
        others = [c for c in self._alive() if c.node_id != me.node_id]
        members = self._members_in_reach(me)
        size = self.cluster_size(me)
        masters = [c for c in others if master_claim_backed(c, me, others, size)]
        best_master = max(masters, key=lambda c: (c.term, *rank_key(c)), default=None)
        if me.is_master:
            if best_master and (best_master.term, *rank_key(best_master)) > (
                me.term,
                *rank_key(me),
            ):
                logger.info(
                    f"stepping down: {best_master.node_id} is master of term {best_master.term}"
                )
                await self._step_down()
                await self._set_following(best_master)
                return
            # Nodes that voted in a newer term no longer acknowledge ours, and cannot follow
            # us: step down so that an election picks a term after their votes. A vote
            # rounds beyond any election that could have happened is a lie (a member forging
            # campaigns), and does not depose a master. Outsiders' votes count here: a cluster
            # that formed apart and led a later term is met this way (the members then elect
            # after its term, and it follows them).
            later = [c for c in others if plausible_later_vote(c.voted_term, me.term)]
            if later:
                voted = max(later, key=lambda c: c.voted_term)
                logger.info(
                    f"stepping down: {len(later)} node(s) voted after our term ({me.term}), "
                    f"{voted.node_id} in term {voted.voted_term}"
                )
                await self._step_down()
            return
        if best_master and best_master.term >= max(self.term, me.term):
            # Following it again after counting it lost (its claim lacked votes for a moment,
            # e.g. until this node voted in its term) ends the loss: turns counted from a
            # stale loss would pick another candidate than the other survivors at failover.
            following = (self.master, self.term) == (best_master.node_id, best_master.term)
            if not following or self._lost_master_at is not None:
                await self._set_following(best_master)
            return
        # No live master.
        if self.master is not None and self._lost_master_at is None:
            logger.warning(f"master {self.master} lost; electing a new one")
            self._lost_master_at = now
        if self._started is None or now - self._started < self.timing.settle:
            return
        alone = not others and self.master is None and self._expect_peers
        if alone and now - self._started < self.timing.alone_grace:
            return  # our bootstrap peers may just be slow to answer
        if self._lost_master_at is not None and now - self._lost_master_at < self.timing.regroup:
            return
        if not is_majority(1 + len(members), size):
            return  # too few nodes in reach to commit anything: no master on this side
        # Outsiders stand aside while members are in reach: an outsider's forced mastership
        # must not make the members wait for it.
        pool = self.eligible([me, *others])
        if candidate(pool, self._failed_turns(now)).node_id == me.node_id:
            term = new_term(self.term, pool, me.node_id)
            if await self._become_master(term):
                self.master, self.term, self._lost_master_at = me.node_id, term, None

    def _failed_turns(self, now: float) -> int:
        """How many candidates had their `takeover` turn since the master was lost."""
        lost = self._lost_master_at
        return (
            0 if lost is None else int((now - lost - self.timing.regroup) // self.timing.takeover)
        )

    async def _set_following(self, master: Campaign) -> None:
        self.master, self.term, self._lost_master_at = master.node_id, master.term, None
        await self._follow(master.node_id, master.term)
