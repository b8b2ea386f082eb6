"""One exo node: it builds its parts and wires them together.

The parts, each built from narrow arguments: the peer protocol (`exo_core.peers`: messages,
catch-up, bodies), the campaign (`exo_core.campaign`: elections, votes, the master role),
telemetry (`exo_core.reporting`), the worker (`exo_core.worker`), the generation service
(`exo_core.service`) and the plugins' view of the node (`exo_core.context.PluginContext`).

API call -> command -> master -> indexed events -> every replica -> worker plans from state
runner -> chunks -> (data plane) -> the node whose API holds the caller's request
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from loguru import logger

from exo_core.bodies import BodyStore
from exo_core.campaign import Campaigner
from exo_core.chunks import ChunkRouter
from exo_core.commands import Command, CommandResult
from exo_core.config import NodeConfig, model_roots
from exo_core.context import Job, PluginContext
from exo_core.datadir import DataDirLock
from exo_core.decide import MasterContext
from exo_core.downloads import Downloader
from exo_core.durable import replace_durably
from exo_core.election import Election, ElectionTiming
from exo_core.engine import Engine
from exo_core.eventlog import EventLog
from exo_core.events import IndexedEvent, InstanceDeleted, TaskStatusChanged
from exo_core.generation import (
    Chunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
)
from exo_core.ids import ModelId, NodeId, TaskId
from exo_core.local_cards import watch_models_dir
from exo_core.master import Master
from exo_core.metrics import NodeMetrics
from exo_core.model_cards import ModelCard, index_cards
from exo_core.parsers import ChainedParser, OutputParser, ParserFactory
from exo_core.peers import NoMaster, NotCommitted, PeerProtocol, RefusalLog
from exo_core.placement import including, runnable
from exo_core.placement_types import PlacementOption, PlacementRefused, PlacementRequest
from exo_core.plugin_host import PluginHost, describe
from exo_core.replica import Replica
from exo_core.reporting import REPORT_WAIT_S, Reporter
from exo_core.service import GenerationService
from exo_core.snapshot import SnapshotStore
from exo_core.start_model import place_at_start
from exo_core.state import State, TaskStatus
from exo_core.supervise import essential, keep_running
from exo_core.transport.base import Transport
from exo_core.transport.memory import MemoryNetwork
from exo_core.trust import card_to_run, placement_view
from exo_core.votes import VoteBook
from exo_core.wire import ELECTION_TOPIC, EVENTS_TOPIC
from exo_core.worker import Worker

__all__ = ["NoMaster", "Node", "NotCommitted"]


def _persistent_node_id(data_dir: Path) -> NodeId:
    path = data_dir / "node_id"
    if path.exists():
        return NodeId(path.read_text().strip())
    node_id = f"node-{uuid.uuid4().hex[:16]}"
    replace_durably(path, node_id.encode())
    return NodeId(node_id)


class Node:
    """A running exo node. Hooks get `context` (the `NodeContext`, nothing more); the native
    API's handlers get the node itself."""

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
        self._tg: TaskGroup | None = None
        self.started_at = time.time()
        self.ready = anyio.Event()
        self.replica.listen(self._observe)
        self.metrics = NodeMetrics(self)
        refusals = RefusalLog()
        self.campaigner = Campaigner(
            node_id=self.node_id,
            config=config,
            priority=sum(plugins.results("exo_election_priority", config=config)),
            replica=self.replica,
            votes=self.votes,
            transport=self.transport,
            metrics=self.metrics,
            timing=election_timing,
            master_context=self._master_context,
            sync_from=lambda peer, timeout: self.peers.sync_from(peer, timeout),
            decode_answer=refusals.decode_answer,
            follow=lambda: self.peers.follow_new_master(),
            start_soon=self._start_soon,
        )
        self.peers = PeerProtocol(
            node_id=self.node_id,
            transport=self.transport,
            replica=self.replica,
            votes=self.votes,
            campaigner=self.campaigner,
            router=self.router,
            bodies=self.bodies,
            metrics=self.metrics,
            refusals=refusals,
            start_soon=self._start_soon,
        )
        self.generation = GenerationService(self, keepalive_s=config.keepalive_s)
        self.worker: Worker | None = None
        if config.worker:
            self.worker = Worker(
                node_id=self.node_id,
                replica=self.replica,
                engines=self.engines,
                downloader=self.downloader,
                cards=self.card,
                all_cards=self.cards,
                send_command=self.peers.send_command,
                send_chunk=self.peers.deliver_chunk,
                fetch_body=self.peers.fetch_body,
                models_dir=config.models_dir,
                data_dir=data,
                card_to_run=self._card_to_run,
                downloads=config.downloads,
            )
        self.reporter = Reporter(
            node_id=self.node_id,
            config=config,
            replica=self.replica,
            engines=self.engines,
            cards=self.cards,
            runner_pids=self.worker.runner_pids if self.worker else None,
            peers=self.transport.peers,
            send_command=self.send_command,
        )
        # What the plugins see of this node (`NodeContext`), and nothing more.
        self.context = PluginContext(
            node_id=self.node_id,
            config=config,
            state=lambda: self.state,
            started_at=self.started_at,
            downloader=self.downloader,
            card=self.card,
            cards=self.cards,
            send_command=self.send_command,
            run_command=self.run_command,
            download=self.download,
            spawn=self.spawn,
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
        self.reporter.report_now()

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

    async def download(self, card: ModelCard) -> None:
        """Fetch `card`'s model to this node without running it (its worker reports progress)."""
        if self.worker is None:
            raise RuntimeError("this node runs no worker (--no-worker): it keeps no models")
        await self.worker.download(card)

    # -- the parts' jobs, as tests, the API and the service reach them ----------------------

    @property
    def master(self) -> Master | None:
        """This node's master role while it leads, else None (the campaign's)."""
        return self.campaigner.master

    @property
    def election(self) -> Election:
        return self.campaigner.election

    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Have the master run `command`; waits through elections up to `timeout` seconds."""
        return await self.peers.send_command(command, timeout)

    async def deliver_chunk(self, node: NodeId, chunk: Chunk) -> None:
        await self.peers.deliver_chunk(node, chunk)

    async def sync_from(self, peer: NodeId, timeout: float = 30.0) -> bool:
        """Make our log a copy of `peer`'s (see `PeerProtocol.sync_from`)."""
        return await self.peers.sync_from(peer, timeout)

    @property
    def engine_names(self) -> tuple[str, ...]:
        return self.reporter.engine_names

    def servable(self) -> tuple[ModelId, ...]:
        return self.reporter.servable()

    async def wait_reported(self, timeout: float = REPORT_WAIT_S) -> bool:
        """Wait until this node's engines are in state (see `Reporter.wait_reported`)."""
        return await self.reporter.wait_reported(timeout)

    async def run_command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        """Send `command`, then wait (up to `timeout` again) until this node has applied its
        events, so that `state` shows its effect."""
        result = await self.send_command(command, timeout=timeout)
        if result.ok and result.last_index >= 0:
            await self.replica.wait_for(result.last_index, timeout=timeout)
        return result

    def spawn(self, job: Job) -> None:
        """Run `job` in the background while the node runs (for plugins' hooks). A job that
        raises is logged with its plugin's name and dropped: it never stops the node."""
        if self._tg is None:
            raise RuntimeError("the node is not running")
        self._tg.start_soon(self._supervised, job)

    def _start_soon(self, job: Job) -> None:
        """Run one of the core's own jobs in the node's task group."""
        if self._tg is None:
            raise RuntimeError("the node is not running")
        self._tg.start_soon(job)

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
                self.transport.set_request_handler(self.peers.answer)
                await self.transport.subscribe(EVENTS_TOPIC)
                await self.transport.subscribe(ELECTION_TOPIC)
                # No background task ends the node by raising (see exo_core.supervise).
                tg.start_soon(keep_running, "receiving from peers", self.peers.receive)
                tg.start_soon(keep_running, "the election", self.election.run)
                tg.start_soon(keep_running, "catching up", self.peers.catch_up_loop)
                tg.start_soon(keep_running, "telemetry", self.reporter.run)
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

    def _master_context(self) -> MasterContext:
        return MasterContext(
            card=self.card,
            place=self._place,
            builtin=frozenset(self.builtin_cards),
            exclude_nodes=tuple(NodeId(n) for n in self.config.exclude_nodes),
        )

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
        self.plugins.notify("exo_event_applied", event=event, state=state, ctx=self.context)


def _flatten(results: list[Any]) -> list[Any]:
    out: list[Any] = []
    for r in results:
        if isinstance(r, list):
            out.extend(r)
        elif r is not None:
            out.append(r)
    return out
