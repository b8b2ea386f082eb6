"""One exo node: transport, replica, election, master (when elected), worker and API.

API call -> command -> master -> indexed events -> every replica -> worker plans from state
runner -> chunks -> (data plane) -> the node whose API holds the caller's request
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskGroup
from loguru import logger

from exo_core.bodies import Body, BodyStore, BodyUnavailable, with_body
from exo_core.chunks import ChunkRouter
from exo_core.commands import Command, CommandEnvelope, CommandResult, ReportEvents
from exo_core.config import NodeConfig, model_roots
from exo_core.context import Job
from exo_core.datadir import DataDirLock
from exo_core.decide import MasterContext, decide_node_timeout
from exo_core.downloads import Downloader, needs_fetching
from exo_core.durable import replace_durably
from exo_core.election import Election, ElectionTiming, is_majority
from exo_core.engine import Engine
from exo_core.eventlog import EventLog, LogWriteFailed
from exo_core.events import (
    IndexedEvent,
    InstanceDeleted,
    NodeTelemetry,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.generation import (
    Chunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
)
from exo_core.ids import CommandId, ModelId, NodeId, TaskId, new_id
from exo_core.local_cards import watch_models_dir
from exo_core.master import Master
from exo_core.metrics import NodeMetrics
from exo_core.model_cards import ModelCard, index_cards
from exo_core.parsers import ChainedParser, OutputParser, ParserFactory
from exo_core.peer_auth import (
    chunk_refusal,
    command_refusal,
    is_member,
    is_stale,
    speaks_for_itself,
    vote_refusal,
)
from exo_core.placement import including, runnable
from exo_core.placement_types import PlacementOption, PlacementRefused, PlacementRequest
from exo_core.plugin_host import PluginHost, describe
from exo_core.replica import Ingested, Replica
from exo_core.service import GenerationService
from exo_core.snapshot import Snapshot, SnapshotStore
from exo_core.start_model import place_at_start
from exo_core.state import State, Task, TaskStatus
from exo_core.supervise import essential, keep_running
from exo_core.telemetry import cap_memory, gather_resources, hostname, local_addresses
from exo_core.transport.base import (
    PeerDisconnected,
    Transport,
    TransportError,
    TransportLagged,
    TransportMessage,
)
from exo_core.transport.memory import MemoryNetwork
from exo_core.trust import card_to_run, placement_view
from exo_core.votes import VoteBook
from exo_core.wire import (
    ELECTION_TOPIC,
    EVENTS_TOPIC,
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
    Vote,
    VoteRequest,
    decode_broadcast,
    decode_request,
    decode_response,
    encode,
    encode_catch_up,
)
from exo_core.worker import Worker

TELEMETRY_INTERVAL_S = 5.0
# How long a placement waits for a just-started node's first telemetry before placing anyway.
REPORT_WAIT_S = 30.0
NODE_TIMEOUT_S = 30.0
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


def _persistent_node_id(data_dir: Path) -> NodeId:
    path = data_dir / "node_id"
    if path.exists():
        return NodeId(path.read_text().strip())
    node_id = f"node-{uuid.uuid4().hex[:16]}"
    replace_durably(path, node_id.encode())
    return NodeId(node_id)


class Node:
    """A running exo node. Plugins see it as their `NodeContext`."""

    def __init__(
        self,
        config: NodeConfig,
        plugins: PluginHost,
        transport: Transport | None = None,
        election_timing: ElectionTiming = ElectionTiming(),
        data_lock: DataDirLock | None = None,
    ) -> None:
        self.config = config
        self.plugins = plugins
        data = config.data_path
        # Before anything in the data directory is opened: one process per directory.
        self.data_lock = data_lock or DataDirLock(data)
        self.transport = transport or self._make_transport(data)
        self.node_id = NodeId(self.transport.node_id)
        self.replica = Replica(
            EventLog(data / "events.log"),
            SnapshotStore(data / "snapshot.bin"),
            snapshot_every=config.snapshot_every,
        )
        self.votes = VoteBook(data / "vote.json")
        self.router = ChunkRouter()
        self.bodies = BodyStore()
        engines = plugins.collect("exo_engines", config=config)
        self.downloader: Downloader | None = plugins.first(
            "exo_downloader", config=config, node_id=self.node_id
        )
        cards = plugins.collect("exo_model_cards", config=config)
        parsers = plugins.collect("exo_output_parsers")
        # A plugin left out by a later hook takes back what its earlier hooks gave.
        self.engines: list[Engine] = _flatten(plugins.kept(engines))
        self.builtin_cards = index_cards(c for found in plugins.kept(cards) for c in found)
        self.parsers: dict[str, ParserFactory] = {}
        for found in plugins.kept(parsers):
            self.parsers.update(found)
        self.master: Master | None = None
        self._master_scope: anyio.CancelScope | None = None
        self.election = Election(
            me=self._campaign,
            broadcast=self._broadcast_campaign,
            become_master=self._run_for_master,
            follow=self._follow,
            step_down=self._step_down,
            timing=election_timing,
            expect_peers=bool(config.bootstrap_peers),
            eligible=lambda node_id: is_member(node_id, self.state),
        )
        self._priority = sum(plugins.results("exo_election_priority", config=config))
        self._catch_up_wanted = anyio.Event()
        self._report_now = anyio.Event()
        # The catch-up in flight (made inside the loop: a CancelScope needs a running loop).
        self._catch_up_scope: anyio.CancelScope | None = None
        self._in_flight: Counter[str] = Counter()
        self._refusals_logged: dict[str, float] = {}
        self._tg: TaskGroup | None = None
        self.started_at = time.time()
        self.ready = anyio.Event()
        self.replica.listen(self._observe)
        self.generation = GenerationService(self, keepalive_s=config.keepalive_s)
        self.metrics = NodeMetrics(self)
        self.worker: Worker | None = None
        if config.worker:
            self.worker = Worker(
                node_id=self.node_id,
                replica=self.replica,
                engines=self.engines,
                downloader=self.downloader,
                cards=self.card,
                all_cards=self.cards,
                send_command=self.send_command,
                send_chunk=self.deliver_chunk,
                fetch_body=self.fetch_body,
                models_dir=config.models_dir,
                data_dir=data,
                card_to_run=self._card_to_run,
                downloads=config.downloads,
            )

    def _make_transport(self, data: Path) -> Transport:
        if self.config.transport != "memory":
            chosen = self.plugins.first("exo_transport", config=self.config)
            if chosen is not None:
                return chosen
            if self.config.transport:
                raise RuntimeError(f"no plugin provides the transport '{self.config.transport}'")
        return MemoryNetwork().transport(_persistent_node_id(data))

    # -- what plugins use (NodeContext) -------------------------------------------------------

    @property
    def state(self) -> State:
        return self.replica.state

    def card(self, model_id: str) -> ModelCard | None:
        """A built-in card, else a custom card from state: a card from the cluster never
        replaces this node's own (see exo_core.trust)."""
        return self.builtin_cards.get(ModelId(model_id)) or self.state.model_cards.get(
            ModelId(model_id)
        )

    def cards(self) -> dict[ModelId, ModelCard]:
        return {**self.state.model_cards, **self.builtin_cards}

    def _card_to_run(self, card: ModelCard) -> ModelCard:
        """The card as this node runs it (raises `RunRefused`; see exo_core.trust)."""
        own = self.builtin_cards.get(card.model_id) == card
        return card_to_run(
            card, own=own, roots=model_roots(self.config), remote_code=self.config.trust_remote_code
        )

    def _scan_cards(self) -> dict[ModelId, ModelCard]:
        """The plugins' cards asked again while running: a plugin that raises now is reported
        and keeps serving (its cards are missing until it answers again)."""
        found = self.plugins.collect("exo_model_cards", leave_out=False, config=self.config)
        return index_cards(c for cards in self.plugins.kept(found) for c in cards)

    async def _watch_models_dir(self) -> None:
        await watch_models_dir(
            self.config.models_dir,
            rescan=self._scan_cards,
            current=lambda: self.builtin_cards,
            install=self._install_cards,
        )

    def _install_cards(self, cards: dict[ModelId, ModelCard]) -> None:
        self.builtin_cards = cards
        # Placement reads what each node serves from telemetry: report it now, not in 5 s.
        self._report_now.set()

    def parser_for(self, card: ModelCard, params: GenerationParams) -> OutputParser | None:
        names = [n for n in (card.reasoning_parser, card.tool_parser) if n]
        parsers = [self.parsers[n](card, params) for n in names if n in self.parsers]
        return ChainedParser(parsers) if parsers else None

    def place_options(self, request: PlacementRequest) -> list[PlacementOption]:
        card = self.card(request.model_id)
        if card is None:
            return []
        # Previews show only what this node would ask for: not on the nodes it excludes.
        excluded = tuple(NodeId(n) for n in self.config.exclude_nodes)
        return self._place(card, request, placement_view(self.state, (), excluded))

    def _place(
        self, card: ModelCard, request: PlacementRequest, state: State
    ) -> list[PlacementOption]:
        if (unrunnable := self._unrunnable(card)) is not None:
            raise PlacementRefused(unrunnable)
        # Called while the node runs: a plugin that raises is logged and the next one (at
        # last the core's default) places; a refusal is an answer and propagates.
        options = self.plugins.first(
            "exo_place_instance",
            leave_out=False,
            passthrough=(PlacementRefused,),
            card=card,
            request=request,
            state=state,
        )
        kept = runnable(options or [], lambda option: self._engine_refusal(card, option))
        return including(kept, request.node_ids)

    def _unrunnable(self, card: ModelCard) -> str | None:
        """Why the engines that serve `card` cannot run it at all, even whole on one node (a
        listed model of an architecture none of them loads), or None. Said first: how much
        memory it would need does not matter then."""
        engines = [e for e in self.engines if e.can_serve(card)]
        reasons = [e.sharding_refusal(card, "pipeline", 1) for e in engines]
        return reasons[0] if engines and all(reasons) else None

    def _engine_refusal(self, card: ModelCard, option: PlacementOption) -> str | None:
        """Why this node's engines for `card` cannot run `option` (they are the cluster's:
        every node runs the same plugins)."""
        engines = [e for e in self.engines if e.can_serve(card)]
        return next((r for e in engines if (r := e.placement_refusal(card, option))), None)

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Have the master run `command`; waits through elections up to `timeout` seconds."""
        envelope = CommandEnvelope(
            command_id=CommandId(new_id("cmd")), origin=self.node_id, command=command
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
        self.metrics.command_duration.labels(type(command).__name__).observe(
            time.perf_counter() - started
        )
        return result

    async def _send_envelope(self, envelope: CommandEnvelope) -> CommandResult:
        timing = self.election.timing
        while True:
            if self.master is not None:
                return await self.master.handle(envelope)
            # A node that has heard no majority for as long as an election takes cannot have
            # a command committed: it says so rather than keep its client waiting.
            cut_off = self.election.cut_off_for()
            if cut_off >= timing.timeout + timing.settle:
                heard, members = self.election.reach()
                raise NotCommitted(
                    f"this node reaches {heard} of the cluster's {members} members, not a "
                    "majority: it cannot have commands committed until it reaches more"
                )
            target = self.election.master
            if target is not None and target != self.node_id:
                answer = await self._ask_master(target, envelope)
                if answer is not None:
                    return answer
            await anyio.sleep(0.1)

    async def _ask_master(self, target: NodeId, envelope: CommandEnvelope) -> CommandResult | None:
        """The master's answer, or None: no answer, or this node was cut off from the
        majority meanwhile (a link that died silently would keep the request waiting 10 s).
        Asking again is safe: the master answers a command id it knows without applying it."""
        answer: CommandResult | None = None
        timing = self.election.timing

        async def ask(scope: anyio.CancelScope) -> None:
            nonlocal answer
            try:
                raw = await self.transport.request(target, encode(envelope), timeout=10)
                decoded = self._decode_answer(target, raw)
                answer = decoded if isinstance(decoded, CommandResult) else None
            except TransportError as e:
                logger.debug(f"command to master {target} failed: {e}")
            scope.cancel()

        async def give_up_when_cut_off(scope: anyio.CancelScope) -> None:
            while self.election.cut_off_for() < timing.timeout + timing.settle:
                await anyio.sleep(0.2)
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, tg.cancel_scope)
            tg.start_soon(give_up_when_cut_off, tg.cancel_scope)
        return answer

    async def deliver_chunk(self, node: NodeId, chunk: Chunk) -> None:
        if node == self.node_id:
            self.router.deliver(chunk)
            return
        await self.transport.request(node, encode(ChunkBatch(chunks=(chunk,))), timeout=30)

    async def download(self, card: ModelCard) -> None:
        """Fetch `card`'s model to this node without running it (its worker reports progress)."""
        if self.worker is None:
            raise RuntimeError("this node runs no worker (--no-worker): it keeps no models")
        await self.worker.download(card)

    async def run_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Send `command`, then wait (up to `timeout` again) until this node has applied its
        events, so that `state` shows its effect."""
        result = await self.send_command(command, timeout=timeout)
        if result.ok and result.last_index >= 0:
            await self.replica.wait_for(result.last_index, timeout=timeout)
        return result

    async def fetch_body(self, task: Task) -> Task:
        """A task this node runs rank 0 of, with its body from the node that holds the request."""
        origin = task.origin_node
        try:
            if origin == self.node_id:
                return with_body(task, self.bodies.lend(task.task_id, self.node_id, self.state))
            raw = await self.transport.request(
                origin, encode(FetchBody(task_id=task.task_id)), timeout=30
            )
            answer = self._decode_answer(origin, raw)
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

    def spawn(self, job: Job) -> None:
        """Run `job` in the background while the node runs (for plugins' hooks). A job that
        raises is logged with its plugin's name and dropped: it never stops the node."""
        if self._tg is None:
            raise RuntimeError("the node is not running")
        self._tg.start_soon(self._supervised, job)

    async def _supervised(self, job: Job) -> None:
        try:
            await job()
        except Exception as e:
            owner = self.plugins.owner_of(job) or "?"
            what = getattr(job, "__qualname__", None) or repr(job)
            logger.error(f"plugin {owner}: background job {what} raised {describe(e)}; dropped")
            logger.opt(exception=e).debug(f"plugin {owner}: where {what} raised")

    # -- running ------------------------------------------------------------------------------

    async def run(self, *, extra: Sequence[Callable[[], Coroutine[Any, Any, Any]]] = ()) -> None:
        """Run until cancelled. `extra` coroutines (such as the API server) run alongside."""
        await self.transport.start()
        logger.info(f"node {self.node_id} started; data in {self.config.data_dir}")
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self.transport.set_request_handler(self._answer)
                await self.transport.subscribe(EVENTS_TOPIC)
                await self.transport.subscribe(ELECTION_TOPIC)
                # No background task ends the node by raising (see exo_core.supervise).
                tg.start_soon(keep_running, "receiving from peers", self._receive)
                tg.start_soon(keep_running, "the election", self.election.run)
                tg.start_soon(keep_running, "catching up", self._catch_up_loop)
                tg.start_soon(keep_running, "telemetry", self._telemetry_loop)
                tg.start_soon(keep_running, "watching the models dir", self._watch_models_dir)
                if self.worker is not None:
                    tg.start_soon(essential, "the worker", self.worker.run)
                for job in extra:
                    tg.start_soon(essential, "the API", job)
                if self.config.start_model:
                    place = functools.partial(place_at_start, self, self.config.start_model)
                    tg.start_soon(keep_running, "placing the -m model", place)
                self.ready.set()
        finally:
            with anyio.CancelScope(shield=True):
                await self.transport.stop()
                self.replica.log.close()
                self.data_lock.release()
                logger.info(f"node {self.node_id} stopped")

    async def _receive(self) -> None:
        async for event in self.transport.events():
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
                            self._log_refusal(sender, refusal)
                            continue
                        self.election.observe(message)
                    elif isinstance(message, EventBatch):
                        self._ingest_broadcast(sender, message)
                case PeerDisconnected(peer=peer):
                    self.election.forget(NodeId(peer))
                case TransportLagged(dropped=dropped):
                    logger.warning(f"transport dropped {dropped} inbound messages; catching up")
                    self._catch_up_wanted.set()
                case _:
                    pass

    def _ingest_broadcast(self, sender: str, batch: EventBatch) -> None:
        if self.master is not None or sender != self.election.master:
            return  # only the master we follow writes our log
        if self.election.term < self.votes.term:
            return  # we voted for a newer term: this master is deposed
        try:
            outcome = self.replica.ingest(batch.events, batch.prev_term)
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
            self.replica.mark_committed(min(batch.committed, batch.events[-1].index))

    def _acknowledge(self) -> None:
        """Tell the master how far our durable log matches its own (it counts a majority)."""
        master = self.election.master
        if master is None or master == self.node_id or self._tg is None:
            return
        if self.election.term < self.votes.term:
            return  # never help a deposed master count a majority
        index = self.replica.state.last_index
        ack = Replicated(node_id=self.node_id, index=index, term=self.replica.term_at(index))

        async def send() -> None:
            try:
                await self.transport.request(master, encode(ack), timeout=5)
            except TransportError as e:
                logger.debug(f"replication ack to {master} failed: {e}")

        self._tg.start_soon(send)

    async def _answer(self, sender: str, payload: bytes) -> bytes:
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
        match request:
            case CommandEnvelope():
                if self.master is None:
                    return encode(NotMaster(master=self.election.master))
                refusal = command_refusal(sender, request, self.state)
                if refusal is not None:
                    self._log_refusal(sender, refusal)
                    return encode(
                        CommandResult(command_id=request.command_id, status=403, message=refusal)
                    )
                self.master.heard_from(NodeId(sender))
                if isinstance(request.command, ReportEvents):
                    events = tuple(e for e in request.command.events if not is_stale(e, self.state))
                    request = msgspec.structs.replace(request, command=ReportEvents(events=events))
                return encode(await self.master.handle(request))
            case CatchUp(start=start, prev_term=prev_term, limit=limit):
                if start > 0 and self.replica.term_at(start - 1) != prev_term:
                    return encode(Diverged())
                if start < self.replica.first_index and self.replica.snapshot is not None:
                    return encode(self.replica.snapshot)
                events = self.replica.log.read(start, start + min(limit, MAX_CATCH_UP_EVENTS))
                return encode_catch_up(
                    events, prev_term, MAX_CATCH_UP_BYTES, committed=self.replica.committed
                )
            case Replicated(index=index, term=term):
                refusal = speaks_for_itself(sender, request)
                if refusal is not None:
                    return self._refused(sender, refusal)
                if self.master is not None:
                    self.master.replicated(NodeId(sender), index, term)
                return encode(Ack())
            case VoteRequest():
                return encode(self._vote(request, sender))
            case ChunkBatch(chunks=chunks):
                for chunk in chunks:
                    instance_id = self.router.instance_of(chunk.task_id)
                    refusal = chunk_refusal(sender, instance_id, self.state)
                    if refusal is not None:
                        return self._refused(sender, refusal)
                for chunk in chunks:
                    self.router.deliver(chunk)
                return encode(Ack())
            case FetchBody(task_id=task_id):
                try:
                    body = self.bodies.lend(task_id, NodeId(sender), self.state)
                except BodyUnavailable as e:
                    return encode(NoBody(reason=str(e)))
                return encode(TaskBody(task_id=task_id, params=body.params, image=body.image))
            case _:
                return self._refused(sender, f"unexpected request {type(request).__name__}")

    def _refused(self, sender: str, reason: str) -> bytes:
        self._log_refusal(sender, reason)
        return encode(Refused(reason=reason))

    def _log_refusal(self, sender: str, reason: str) -> None:
        now = time.monotonic()
        if (
            now - self._refusals_logged.get(sender, -REFUSAL_LOG_INTERVAL_S)
            >= REFUSAL_LOG_INTERVAL_S
        ):
            self._refusals_logged[sender] = now
            logger.warning(f"refused a message from peer {sender}: {reason}")

    def _decode_answer(self, peer: str, raw: bytes) -> Response | None:
        """A peer's answer, or None when it is not one (a peer's bytes never end the node)."""
        try:
            return decode_response(raw)
        except msgspec.DecodeError as e:
            self._log_refusal(peer, f"undecodable answer: {e}")
            return None

    async def _catch_up_loop(self) -> None:
        """Catch up when asked to, and at least once a second: the last broadcast before a
        quiet spell may have been lost, and then no gap would ever show."""
        while True:
            with anyio.move_on_after(CATCH_UP_INTERVAL_S):
                await self._catch_up_wanted.wait()
            self._catch_up_wanted = anyio.Event()
            master = self.election.master
            following = self.master is None and master not in (None, self.node_id)
            # Following a new master ends a catch-up from the old one (which may hang on a
            # master that fell silent until its request times out).
            with anyio.CancelScope() as self._catch_up_scope:
                if following and master is not None and await self.sync_from(master):
                    self._acknowledge()

    async def sync_from(self, peer: NodeId, timeout: float = 30.0) -> bool:
        """Make our log a copy of `peer`'s (cutting what diverges), in batches."""
        with anyio.move_on_after(timeout):
            while True:
                start = self.replica.next_index
                request = CatchUp(start=start, prev_term=self.replica.term_at(start - 1))
                try:
                    raw = await self.transport.request(peer, encode(request), timeout=30)
                except TransportError as e:
                    logger.debug(f"catch-up from {peer} failed: {e}")
                    return False
                answer = self._decode_answer(peer, raw)
                if answer is None:
                    return False
                if isinstance(answer, Diverged):
                    self.replica.truncate(self.replica.divergence_point())
                    continue
                if isinstance(answer, Snapshot):
                    if answer.next_index <= start:
                        return False  # nothing we miss: not an answer to our question
                    self.replica.install(answer)
                    continue
                if not isinstance(answer, EventBatch) or not answer.events:
                    return True
                try:
                    outcome = self.replica.ingest(answer.events, answer.prev_term)
                except LogWriteFailed as e:
                    logger.error(str(e))
                    return False
                if outcome == Ingested.DIVERGED:
                    self.replica.truncate(self.replica.divergence_point())
                elif outcome == Ingested.UP_TO_DATE:
                    self._learn_committed(answer)
        return False

    # -- election -----------------------------------------------------------------------------

    def _campaign(self) -> Campaign:
        node = self.state.nodes.get(self.node_id)
        return Campaign(
            node_id=self.node_id,
            term=self.master.term if self.master else self.replica.last_term,
            force_master=self.config.force_master,
            priority=self._priority,
            seniority=node.joined_index if node else 1 << 62,
            commands_seen=self.replica.next_index,
            is_master=self.master is not None,
            members=len({*self.state.nodes, self.node_id}),
            voted_term=self.votes.term,
            voted_for=self.votes.voted_for,
        )

    async def _broadcast_campaign(self, campaign: Campaign) -> None:
        await self.transport.publish(ELECTION_TOPIC, encode(campaign))

    async def _publish_events(
        self, events: tuple[IndexedEvent, ...], prev_term: int, committed: int
    ) -> None:
        batch = EventBatch(events=events, prev_term=prev_term, committed=committed)
        try:
            await self.transport.publish(EVENTS_TOPIC, encode(batch))
        except TransportError as e:
            # Followers notice on their next catch-up and fetch by request.
            logger.debug(f"event broadcast failed: {e}")

    def _vote(self, request: VoteRequest, sender: str) -> Vote:
        # A master is its own live master: it votes for nobody else while it leads.
        live = self.node_id if self.master is not None else self.election.live_master()
        refusal = vote_refusal(sender, request, live)
        if refusal is not None:
            return Vote(granted=False, reason=refusal)
        vote = self.votes.decide(request, self.replica.last_term, self.replica.state.last_index)
        if vote.granted and self.master is not None:
            logger.info(f"stepping down: voted for {request.candidate} in term {request.term}")
            self.master = None
        return vote

    async def _gather_votes(self, term: int) -> bool:
        """Ask every peer for its vote in `term`; True with a majority of the members."""
        me = VoteRequest(
            term=term,
            candidate=self.node_id,
            last_term=self.replica.last_term,
            last_index=self.replica.state.last_index,
        )
        if not self._vote(me, self.node_id).granted:
            return False
        granted = 1
        members = self.election.cluster_size(self._campaign())

        async def ask(peer: str) -> None:
            nonlocal granted
            try:
                raw = await self.transport.request(peer, encode(me), timeout=1.0)
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
            for peer in self.transport.peers():
                tg.start_soon(ask, peer)
        if not is_majority(granted, members):
            logger.info(f"term {term}: {granted} of {members} votes, not a majority")
            return False
        return True

    async def _run_for_master(self, term: int) -> bool:
        won = await self._become_master(term)
        self.metrics.campaigns.labels("won" if won else "lost").inc()
        return won

    async def _become_master(self, term: int) -> bool:
        """Take over: catch up from the most complete log in reach, win a majority of votes,
        then start the term."""
        me = self._campaign()
        # Only a member's log is worth copying (an outsider could claim any log).
        members = [c for c in self.election.alive() if is_member(c.node_id, self.state)]
        best = max(members, key=lambda c: (c.term, c.commands_seen), default=None)
        if (
            best is not None
            and best.node_id != self.node_id
            and (best.term, best.commands_seen)
            > (
                me.term,
                me.commands_seen,
            )
        ):
            logger.info(f"catching up from {best.node_id} before taking over")
            if not await self.sync_from(best.node_id, timeout=10):
                return False
        if not await self._gather_votes(term):
            return False
        ctx = self._master_context()
        master = Master(self.node_id, term, self.replica, ctx, self._publish_events)
        master.known_nodes(self.state.nodes)
        self.master = master
        await master.start()
        assert self._tg is not None
        self._tg.start_soon(self._master_duties, master)
        return True

    def _master_context(self) -> MasterContext:
        return MasterContext(
            card=self.card,
            place=self._place,
            builtin=frozenset(self.builtin_cards),
            exclude_nodes=tuple(NodeId(n) for n in self.config.exclude_nodes),
        )

    async def _follow(self, master: NodeId, term: int) -> None:
        logger.info(f"following master {master} (term {term})")
        if self._catch_up_scope is not None:
            self._catch_up_scope.cancel()
        self._catch_up_wanted.set()

    async def _step_down(self) -> None:
        self.master = None

    async def _master_duties(self, master: Master) -> None:
        """Time out silent nodes while this node is master, and ask for missing votes."""
        while self.master is master:
            await anyio.sleep(1.0)
            await self._ask_missing_votes(master)
            for node_id in master.silent_nodes(NODE_TIMEOUT_S, exclude=self.node_id):
                logger.warning(f"node {node_id} unseen for {NODE_TIMEOUT_S:.0f}s: timing it out")
                ctx = self._master_context()
                await master.commit(decide_node_timeout(self.state, node_id, ctx))

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The engines this node runs, as its telemetry reports them (none without a worker)."""
        if self.worker is None:
            return ()
        return tuple(sorted({e.name for e in self.engines if e.name}))

    def reported(self) -> bool:
        """Whether state holds this node with its engines: placement reads them from there."""
        known = self.state.nodes.get(self.node_id)
        return not self.engine_names or (
            known is not None and set(self.engine_names) <= set(known.resources.engines)
        )

    async def wait_reported(self, timeout: float = REPORT_WAIT_S) -> bool:
        """Wait until `reported()`: a node that just started answers its API before its first
        telemetry is in state, and placing then would find no node with its engines."""
        with anyio.move_on_after(timeout):
            while not self.reported():
                await self.replica.wait_change()
            return True
        return False

    def servable(self) -> tuple[ModelId, ...]:
        """The known models that some local engine can serve (placement asks telemetry); with
        `--no-downloads`, of the hub's models only those already on this node's disk."""
        on_disk = self.state.downloads.get(self.node_id, {})
        return tuple(
            sorted(
                m
                for m, card in self.cards().items()
                if any(_serves(e, card) for e in self.engines)
                and (self.config.downloads or not needs_fetching(card, on_disk.get(m)))
            )
        )

    async def _ask_missing_votes(self, master: Master) -> None:
        """A node follows a master its own vote backs (or a majority's announced votes): ask
        those that have not voted in our term (they joined later, or were out of reach during
        the election) for their vote."""
        voted = {c.node_id for c in self.election.alive() if c.voted_term == master.term}
        missing = [p for p in self.transport.peers() if p not in voted]
        if not missing:
            return
        request = VoteRequest(
            term=master.term,
            candidate=self.node_id,
            last_term=self.replica.last_term,
            last_index=self.replica.state.last_index,
        )

        async def ask(peer: str) -> None:
            with contextlib.suppress(TransportError):
                await self.transport.request(peer, encode(request), timeout=1.0)

        async with anyio.create_task_group() as tg:
            for peer in missing:
                tg.start_soon(ask, peer)

    # -- telemetry ----------------------------------------------------------------------------

    async def _telemetry_loop(self) -> None:
        addresses = local_addresses(self.config.listen_host)
        while True:
            serves = self.servable() if self.worker else ()
            resources = cap_memory(
                gather_resources(
                    self.config.data_dir,
                    self.engine_names,
                    serves,
                    self.worker.runner_pids() if self.worker else None,
                ),
                self.config.max_memory,
            )
            report = ReportEvents(
                events=(
                    NodeTelemetry(
                        node_id=self.node_id,
                        hostname=hostname(),
                        addresses=addresses,
                        resources=resources,
                        timestamp=time.time(),
                    ),
                    TopologyReported(
                        node_id=self.node_id,
                        peers=tuple(sorted(NodeId(p) for p in self.transport.peers())),
                    ),
                )
            )
            try:
                await self.send_command(report, timeout=10)
            except (TimeoutError, TransportError) as e:
                logger.debug(f"telemetry not sent: {e!r}")
            with anyio.move_on_after(TELEMETRY_INTERVAL_S):
                await self._report_now.wait()
            self._report_now = anyio.Event()

    # -- observers ------------------------------------------------------------------------------

    def _observe(self, event: IndexedEvent, state: State) -> None:
        """End the streams of local callers whose task can no longer answer."""
        match event.event:
            case TaskStatusChanged(task_id=task_id, status=TaskStatus.FAILED, error=error):
                if task_id in self.router.waiting():
                    self.router.fail(task_id, error or "the task failed")
            case TaskStatusChanged(task_id=task_id, status=TaskStatus.CANCELLED):
                if task_id in self.router.waiting():
                    self.router.deliver(
                        FinishChunk(task_id=TaskId(task_id), finish_reason=FinishReason.CANCELLED)
                    )
            case InstanceDeleted(instance_id=instance_id, reason=reason):
                for task_id in self.router.tasks_of(instance_id):
                    self.router.fail(task_id, f"the instance was deleted: {reason}")
            case _:
                pass
        self.plugins.notify("exo_event_applied", event=event, state=state, ctx=self)


def _serves(engine: Engine, card: ModelCard) -> bool:
    try:
        return engine.can_serve(card)
    except Exception as e:  # an engine plugin's bug: it serves nothing it fails on
        logger.debug(f"engine {engine.name}: can_serve({card.model_id}) raised {describe(e)}")
        return False


def _flatten(results: list[Any]) -> list[Any]:
    out: list[Any] = []
    for r in results:
        if isinstance(r, list):
            out.extend(r)
        elif r is not None:
            out.append(r)
    return out
