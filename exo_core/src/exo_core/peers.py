"""The peer protocol: what this node sends its peers and how it answers them. Commands to the
master, event broadcasts and their acknowledgements, catch-up, votes, chunks and task bodies.

Every message from a peer is hostile until checked: what a peer may ask depends on who it is
(`exo_core.peer_auth`), a payload that does not decode fails its own request only, and a peer
has a bounded number of requests in flight.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import anyio
import msgspec
from loguru import logger

from exo_core.bodies import Body, BodyStore, BodyUnavailable, with_body
from exo_core.campaign import Campaigner
from exo_core.chunks import ChunkRouter
from exo_core.commands import Command, CommandEnvelope, CommandResult, ReportEvents
from exo_core.context import Job
from exo_core.eventlog import LogWriteFailed
from exo_core.generation import Chunk
from exo_core.ids import CommandId, NodeId, new_id
from exo_core.metrics import NodeMetrics
from exo_core.peer_auth import chunk_refusal, command_refusal, is_stale, speaks_for_itself
from exo_core.replica import Ingested, Replica
from exo_core.snapshot import Snapshot
from exo_core.state import Task
from exo_core.transport.base import (
    PeerDisconnected,
    Transport,
    TransportError,
    TransportLagged,
    TransportMessage,
)
from exo_core.votes import VoteBook
from exo_core.wire import (
    MAX_CATCH_UP_BYTES,
    MAX_CATCH_UP_EVENTS,
    Ack,
    Campaign,
    CatchUp,
    ChunkBatch,
    Diverged,
    EventBatch,
    FetchBody,
    NoBody,
    NotMaster,
    Refused,
    Replicated,
    Request,
    Response,
    TaskBody,
    VoteRequest,
    decode_broadcast,
    decode_request,
    decode_response,
    encode,
    encode_catch_up,
)

CATCH_UP_INTERVAL_S = 1.0
# Requests one peer may have this node answer at once; more are refused (the sender retries).
MAX_REQUESTS_IN_FLIGHT = 64
# A refused peer message is logged once per sender in this many seconds (no log flood).
REFUSAL_LOG_INTERVAL_S = 60.0


class NoMaster(RuntimeError):
    """No master answered in time (an election is running or the cluster is partitioned)."""


class NotCommitted(TimeoutError):
    """A command this node could not have committed: no master answered in time, or this node
    hears no majority of the cluster (a partition cut it off). The API answers 503."""


class RefusalLog:
    """Logs a peer's refused messages once per sender a minute (a hostile peer floods no log),
    and reads peers' answers (one that does not decode is refused, never raised)."""

    def __init__(self) -> None:
        self._logged: dict[str, float] = {}

    def log(self, sender: str, reason: str) -> None:
        now = time.monotonic()
        if now - self._logged.get(sender, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self._logged[sender] = now
            logger.warning(f"refused a message from peer {sender}: {reason}")

    def decode_answer(self, peer: str, raw: bytes) -> Response | None:
        """A peer's answer, or None when it is not one (a peer's bytes never end the node)."""
        try:
            return decode_response(raw)
        except msgspec.DecodeError as e:
            self.log(peer, f"undecodable answer: {e}")
            return None


class PeerProtocol:
    def __init__(
        self,
        *,
        node_id: NodeId,
        transport: Transport,
        replica: Replica,
        votes: VoteBook,
        campaigner: Campaigner,
        router: ChunkRouter,
        bodies: BodyStore,
        metrics: NodeMetrics,
        refusals: RefusalLog,
        start_soon: Callable[[Job], None],
    ) -> None:
        self._node_id = node_id
        self._transport = transport
        self._replica = replica
        self._votes = votes
        self._campaigner = campaigner
        self._election = campaigner.election
        self._router = router
        self._bodies = bodies
        self._metrics = metrics
        self._refusals = refusals
        self._start_soon = start_soon
        self._catch_up_wanted = anyio.Event()
        # Made in the running loop (anyio makes no cancel scope outside one).
        self._catch_up_scope: anyio.CancelScope | None = None
        self._in_flight: Counter[str] = Counter()

    # -- asking peers ---------------------------------------------------------------------------

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Have the master run `command`; waits through elections up to `timeout` seconds."""
        envelope = CommandEnvelope(
            command_id=CommandId(new_id("cmd")), origin=self._node_id, command=command
        )
        started = time.perf_counter()
        try:
            with anyio.fail_after(timeout, shield=False):
                result = await self._send_envelope(envelope)
        except TimeoutError as e:
            if isinstance(e, NotCommitted):
                raise
            raise NotCommitted(
                f"no master answered within {timeout:g} s: the command may or may not be applied"
            ) from e
        self._metrics.command_duration.labels(type(command).__name__).observe(
            time.perf_counter() - started
        )
        return result

    async def _send_envelope(self, envelope: CommandEnvelope) -> CommandResult:
        election = self._election
        timing = election.timing
        while True:
            if (master := self._campaigner.master) is not None:
                return await master.handle(envelope)
            # A node that has heard no majority for as long as an election takes cannot have
            # a command committed: it says so rather than keep its client waiting.
            cut_off = election.cut_off_for()
            if cut_off >= timing.timeout + timing.settle:
                heard, members = election.reach()
                raise NotCommitted(
                    f"this node reaches {heard} of the cluster's {members} members, not a "
                    "majority: it cannot have commands committed until it reaches more"
                )
            target = election.master
            if target is not None and target != self._node_id:
                answer = await self._ask_master(target, envelope)
                if answer is not None:
                    return answer
            await anyio.sleep(0.1)

    async def _ask_master(self, target: NodeId, envelope: CommandEnvelope) -> CommandResult | None:
        """The master's answer, or None: no answer, or this node was cut off from the
        majority meanwhile (a link that died silently would keep the request waiting 10 s).
        Asking again is safe: the master answers a command id it knows without applying it."""
        answer: CommandResult | None = None
        timing = self._election.timing

        async def ask(scope: anyio.CancelScope) -> None:
            nonlocal answer
            try:
                raw = await self._transport.request(target, encode(envelope), timeout=10)
                decoded = self._refusals.decode_answer(target, raw)
                answer = decoded if isinstance(decoded, CommandResult) else None
            except TransportError as e:
                logger.debug(f"command to master {target} failed: {e}")
            scope.cancel()

        async def give_up_when_cut_off(scope: anyio.CancelScope) -> None:
            while self._election.cut_off_for() < timing.timeout + timing.settle:
                await anyio.sleep(0.2)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, tg.cancel_scope)
            tg.start_soon(give_up_when_cut_off, tg.cancel_scope)
        return answer

    async def deliver_chunk(self, node: NodeId, chunk: Chunk) -> None:
        if node == self._node_id:
            self._router.deliver(chunk)
            return
        await self._transport.request(node, encode(ChunkBatch(chunks=(chunk,))), timeout=30)

    async def fetch_body(self, task: Task) -> Task:
        """A task this node runs rank 0 of, with its body from the node that holds the request."""
        origin = task.origin_node
        try:
            if origin == self._node_id:
                lent = self._bodies.lend(task.task_id, self._node_id, self._replica.state)
                return with_body(task, lent)
            raw = await self._transport.request(
                origin, encode(FetchBody(task_id=task.task_id)), timeout=30
            )
            answer = self._refusals.decode_answer(origin, raw)
        except TransportError as e:
            raise BodyUnavailable(
                f"could not fetch the request of task {task.task_id} from node {origin}: {e}"
            ) from e
        except BodyUnavailable as e:
            raise BodyUnavailable(
                f"the request of task {task.task_id} is not available: {e}"
            ) from e
        if isinstance(answer, TaskBody) and answer.task_id == task.task_id:
            return with_body(task, Body(params=answer.params, image=answer.image))
        reason = answer.reason if isinstance(answer, NoBody) else f"unexpected answer {answer!r}"
        raise BodyUnavailable(
            f"node {origin} did not hand over the request of task {task.task_id}: {reason}"
        )

    # -- broadcasts -----------------------------------------------------------------------------

    async def receive(self) -> None:
        async for event in self._transport.events():
            match event:
                case TransportMessage(topic=topic, sender=sender, payload=payload):
                    try:
                        message = decode_broadcast(payload)
                    except Exception as e:
                        logger.warning(f"undecodable broadcast from {sender} on {topic}: {e}")
                        continue
                    if isinstance(message, Campaign):
                        refusal = speaks_for_itself(sender, message)
                        if refusal is not None:
                            self._refusals.log(sender, refusal)
                            continue
                        self._election.observe(message)
                    elif isinstance(message, EventBatch):
                        self._ingest_broadcast(sender, message)
                case PeerDisconnected(peer=peer):
                    self._election.forget(NodeId(peer))
                case TransportLagged(dropped=dropped):
                    logger.warning(f"transport dropped {dropped} inbound messages; catching up")
                    self._catch_up_wanted.set()
                case _:
                    pass

    def _ingest_broadcast(self, sender: str, batch: EventBatch) -> None:
        if self._campaigner.master is not None or sender != self._election.master:
            return  # only the master we follow writes our log
        if self._election.term < self._votes.term:
            return  # we voted for a newer term: this master is deposed
        try:
            outcome = self._replica.ingest(batch.events, batch.prev_term)
        except LogWriteFailed as e:  # not acknowledged; catch-up retries once there is room
            logger.error(str(e))
            return
        if outcome == Ingested.UP_TO_DATE:
            self._learn_committed(batch)
            self._acknowledge()
        else:
            self._catch_up_wanted.set()

    def _learn_committed(self, batch: EventBatch) -> None:
        """Our log matches the sender's through the batch: what it knows committed there is."""
        if batch.events:
            self._replica.mark_committed(min(batch.committed, batch.events[-1].index))

    def _acknowledge(self) -> None:
        """Tell the master how far our durable log matches its own (it counts a majority)."""
        master = self._election.master
        if master is None or master == self._node_id:
            return
        if self._election.term < self._votes.term:
            return  # never help a deposed master count a majority
        index = self._replica.state.last_index
        ack = Replicated(node_id=self._node_id, index=index, term=self._replica.term_at(index))

        async def send() -> None:
            try:
                await self._transport.request(master, encode(ack), timeout=5)
            except TransportError as e:
                logger.debug(f"replication ack to {master} failed: {e}")

        self._start_soon(send)

    # -- answering ------------------------------------------------------------------------------

    async def answer(self, sender: str, payload: bytes) -> bytes:
        """Answer a peer's request. A payload that does not decode fails this request only
        (the transport reports it to the sender); a peer has a bounded number in flight."""
        if self._in_flight[sender] >= MAX_REQUESTS_IN_FLIGHT:
            return self._refused(sender, "too many requests in flight")
        self._in_flight[sender] += 1
        try:
            return await self._answer_request(sender, decode_request(payload))
        finally:
            self._in_flight[sender] -= 1
            if self._in_flight[sender] <= 0:
                del self._in_flight[sender]

    async def _answer_request(self, sender: str, request: Request) -> bytes:
        """What a peer may ask depends on who it is (see `exo_core.peer_auth`)."""
        state = self._replica.state
        master = self._campaigner.master
        match request:
            case CommandEnvelope():
                if master is None:
                    return encode(NotMaster(master=self._election.master))
                refusal = command_refusal(sender, request, state)
                if refusal is not None:
                    self._refusals.log(sender, refusal)
                    return encode(
                        CommandResult(command_id=request.command_id, status=403, message=refusal)
                    )
                master.heard_from(NodeId(sender))
                if isinstance(request.command, ReportEvents):
                    events = tuple(e for e in request.command.events if not is_stale(e, state))
                    request = msgspec.structs.replace(request, command=ReportEvents(events=events))
                return encode(await master.handle(request))
            case CatchUp(start=start, prev_term=prev_term, limit=limit):
                replica = self._replica
                if start > 0 and replica.term_at(start - 1) != prev_term:
                    return encode(Diverged())
                if start < replica.first_index and replica.snapshot is not None:
                    return encode(replica.snapshot)
                events = replica.log.read(start, start + min(limit, MAX_CATCH_UP_EVENTS))
                return encode_catch_up(
                    events, prev_term, MAX_CATCH_UP_BYTES, committed=replica.committed
                )
            case Replicated(index=index, term=term):
                refusal = speaks_for_itself(sender, request)
                if refusal is not None:
                    return self._refused(sender, refusal)
                if master is not None:
                    master.replicated(NodeId(sender), index, term)
                return encode(Ack())
            case VoteRequest():
                return encode(self._campaigner.vote(request, sender))
            case ChunkBatch(chunks=chunks):
                for chunk in chunks:
                    instance_id = self._router.instance_of(chunk.task_id)
                    refusal = chunk_refusal(sender, instance_id, state)
                    if refusal is not None:
                        return self._refused(sender, refusal)
                for chunk in chunks:
                    self._router.deliver(chunk)
                return encode(Ack())
            case FetchBody(task_id=task_id):
                try:
                    body = self._bodies.lend(task_id, NodeId(sender), state)
                except BodyUnavailable as e:
                    return encode(NoBody(reason=str(e)))
                return encode(TaskBody(task_id=task_id, params=body.params, image=body.image))
            case _:
                return self._refused(sender, f"unexpected request {type(request).__name__}")

    def _refused(self, sender: str, reason: str) -> bytes:
        self._refusals.log(sender, reason)
        return encode(Refused(reason=reason))

    # -- catching up ----------------------------------------------------------------------------

    def follow_new_master(self) -> None:
        """Following a new master ends a catch-up from the old one (which may hang on a master
        that fell silent until its request times out), and catches up from the new one."""
        if self._catch_up_scope is not None:
            self._catch_up_scope.cancel()
        self._catch_up_wanted.set()

    async def catch_up_loop(self) -> None:
        """Catch up when asked to, and at least once a second: the last broadcast before a
        quiet spell may have been lost, and then no gap would ever show."""
        while True:
            with anyio.move_on_after(CATCH_UP_INTERVAL_S):
                await self._catch_up_wanted.wait()
            self._catch_up_wanted = anyio.Event()
            master = self._election.master
            following = self._campaigner.master is None and master not in (None, self._node_id)
            with anyio.CancelScope() as self._catch_up_scope:
                if following and master is not None and await self.sync_from(master):
                    self._acknowledge()

    async def sync_from(self, peer: NodeId, timeout: float = 30.0) -> bool:
        """Make our log a copy of `peer`'s (cutting what diverges), in batches."""
        replica = self._replica
        with anyio.move_on_after(timeout):
            while True:
                start = replica.next_index
                request = CatchUp(start=start, prev_term=replica.term_at(start - 1))
                try:
                    raw = await self._transport.request(peer, encode(request), timeout=30)
                except TransportError as e:
                    logger.debug(f"catch-up from {peer} failed: {e}")
                    return False
                answer = self._refusals.decode_answer(peer, raw)
                if answer is None:
                    return False
                if isinstance(answer, Diverged):
                    replica.truncate(replica.divergence_point())
                    continue
                if isinstance(answer, Snapshot):
                    if answer.next_index <= start:
                        return False  # nothing we miss: not an answer to our question
                    replica.install(answer)
                    continue
                if not isinstance(answer, EventBatch) or not answer.events:
                    return True
                try:
                    outcome = replica.ingest(answer.events, answer.prev_term)
                except LogWriteFailed as e:
                    logger.error(str(e))
                    return False
                if outcome == Ingested.DIVERGED:
                    replica.truncate(replica.divergence_point())
                elif outcome == Ingested.UP_TO_DATE:
                    self._learn_committed(answer)
        return False
