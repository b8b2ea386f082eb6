"""A hostile peer for simulations: seeded random, truncated and forged peer messages.

`HostilePeer` owns a bare transport on a simulated network (no node behind it). Its messages
come in three kinds, all drawn from one seeded `random.Random` so a run replays from its seed:

* noise: random bytes, valid messages cut short, valid messages with flipped bytes;
* forgeries: messages that speak for an honest node (campaigns, acks, commands, vote requests)
  or claim a role the peer does not hold (master campaigns and event batches, reports about
  other nodes, chunks for tasks it does not run);
* its own bids: campaigns and vote requests as itself with the strongest claims there are
  (forced mastership, huge terms and logs);
* what a member holding the key may try in its own name (issue 25): a card that replaces a
  built-in one with a `local:` source and remote code, telemetry claiming 1 PiB (a magnet for
  placements), and deletions of the honest nodes' models by folder name.

It answers every request made to it with noise or lies. Whatever it forges is marked
(`FORGED`), so a test can check that no forged fact reached any honest log (`forged_in`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import anyio
import msgspec

from exo_core.commands import (
    AddModelCard,
    CommandEnvelope,
    CommandResult,
    DeleteDownload,
    ReportEvents,
    SubmitTask,
)
from exo_core.events import (
    DownloadProgressed,
    Event,
    IndexedEvent,
    MasterElected,
    ModelCardAdded,
    NodeTelemetry,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskStatusChanged,
)
from exo_core.generation import ChatMessage, GenerationParams, TextChunk
from exo_core.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    NodeResources,
    RunnerInfo,
    RunnerStatus,
    State,
    Task,
    TaskStatus,
)
from exo_core.transport.base import Transport, TransportError
from exo_core.wire import (
    ELECTION_TOPIC,
    EVENTS_TOPIC,
    Campaign,
    CatchUp,
    ChunkBatch,
    EventBatch,
    NotMaster,
    Replicated,
    Vote,
    VoteRequest,
    encode,
)

# Every model id, hostname and task id the peer forges starts with this.
FORGED = "forged"
_HUGE = 1 << 62


def forged_card(name: str) -> ModelCard:
    return ModelCard(
        model_id=ModelId(f"{FORGED}-{name}"),
        family="llama",
        n_layers=1,
        hidden_size=8,
        storage_size_bytes=1,
        source="local:/",
        trust_remote_code=True,
        base_model=FORGED,
    )


def forged_builtin(card: ModelCard) -> ModelCard:
    """A built-in card as a hostile member would replace it: its code, from its directory."""
    return msgspec.structs.replace(
        card, source="local:/", trust_remote_code=True, base_model=FORGED
    )


def magnet(node_id: NodeId) -> NodeTelemetry:
    """Telemetry in the peer's own name that would win every placement (1 PiB free)."""
    return NodeTelemetry(
        node_id=node_id,
        hostname=f"{FORGED}-magnet",
        resources=NodeResources(memory_total=1 << 50, memory_available=1 << 50, engines=("x",)),
        timestamp=1e9,
    )


def forged_in(events: Iterable[IndexedEvent], hostile: str) -> list[IndexedEvent]:
    """The events in a log that the hostile peer forged (none may ever be there)."""
    found = []
    for indexed in events:
        e = indexed.event
        if (
            (
                isinstance(e, ModelCardAdded)
                and (e.card.model_id.startswith(FORGED) or e.card.base_model == FORGED)
            )
            or isinstance(e, NodeTimedOut)
            or (isinstance(e, MasterElected) and e.node_id == hostile)
            or (isinstance(e, NodeTelemetry) and e.hostname.startswith(FORGED))
            or (isinstance(e, DownloadProgressed) and e.progress.model_id.startswith(FORGED))
            or (isinstance(e, RunnerStatusChanged) and e.runner.runner_id.startswith(FORGED))
        ):
            found.append(indexed)
    return found


@dataclass
class HostilePeer:
    transport: Transport
    rng: random.Random
    # The honest nodes' ids, and a view of the cluster's state (to forge plausible messages).
    honest: Callable[[], list[str]]
    state: Callable[[], State]
    sent: dict[str, int] = field(default_factory=dict)
    # The honest nodes' built-in cards (what a member would like to replace).
    builtin: Callable[[], list[ModelCard]] = list

    @property
    def me(self) -> NodeId:
        return NodeId(self.transport.node_id)

    # -- the messages ----------------------------------------------------------------------

    def _victim(self) -> NodeId:
        return NodeId(self.rng.choice(self.honest()))

    def _campaign(self, as_node: NodeId) -> Campaign:
        return Campaign(
            node_id=as_node,
            term=self.rng.choice([_HUGE, self.state().last_index + 1 << 16, 1]),
            force_master=True,
            priority=self.rng.randint(0, 1 << 30),
            seniority=0,
            commands_seen=_HUGE,
            is_master=True,
            members=self.rng.choice([1, 2, 1 << 16]),
            voted_term=_HUGE,
            voted_for=as_node,
        )

    def _forged_event(self) -> Event:
        victim = self._victim()
        name = f"{self.rng.randrange(1 << 30):x}"
        state = self.state()
        task_ids = list(state.tasks) or [TaskId(f"{FORGED}-task")]
        choices: list[Event] = [
            NodeTimedOut(node_id=victim),
            ModelCardAdded(card=forged_card(name)),
            MasterElected(node_id=self.me, term=_HUGE),
            NodeTelemetry(
                node_id=victim,
                hostname=f"{FORGED}-{name}",
                resources=NodeResources(memory_total=1 << 50),
                timestamp=1e12,
            ),
            DownloadProgressed(
                progress=DownloadProgress(
                    node_id=victim,
                    model_id=ModelId(f"{FORGED}-{name}"),
                    status=DownloadStatus.COMPLETED,
                )
            ),
            RunnerStatusChanged(
                runner=RunnerInfo(
                    runner_id=RunnerId(f"{FORGED}-{name}"),
                    instance_id=InstanceId(next(iter(state.instances), "none")),
                    node_id=victim,
                    status=RunnerStatus.READY,
                )
            ),
            TaskStatusChanged(
                task_id=self.rng.choice(task_ids), status=TaskStatus.FAILED, error=FORGED
            ),
        ]
        return self.rng.choice(choices)

    def _as_member(self) -> AddModelCard | ReportEvents | DeleteDownload:
        """What a member holding the key tries in its own name."""
        choices: list[AddModelCard | ReportEvents | DeleteDownload] = [
            ReportEvents(events=(magnet(self.me),)),
            DeleteDownload(node_id=self._victim(), model_id=ModelId("some-model-Q4_1-mlx")),
        ]
        choices += [AddModelCard(card=forged_builtin(card)) for card in self.builtin()]
        return self.rng.choice(choices)

    def _command(self) -> CommandEnvelope:
        victim = self._victim()
        origin = self.rng.choice([victim, self.me])
        events = tuple(self._forged_event() for _ in range(self.rng.randint(1, 3)))
        command = self.rng.choice(
            [
                self._as_member() if origin == self.me else ReportEvents(events=events),
                ReportEvents(events=events),
                # In another node's name: refused whatever it asks.
                AddModelCard(card=forged_card(f"{self.rng.randrange(1 << 30):x}"))
                if origin != self.me
                else ReportEvents(events=events),
                SubmitTask(
                    task=Task(
                        task_id=TaskId(f"{FORGED}-task"),
                        instance_id=InstanceId(next(iter(self.state().instances), "none")),
                        model_id=ModelId(f"{FORGED}-model"),
                        origin_node=victim,
                        params=GenerationParams(messages=(ChatMessage(role="user", content="x"),)),
                    )
                ),
            ]
        )
        return CommandEnvelope(
            command_id=CommandId(f"{FORGED}-{self.rng.randrange(1 << 30)}"),
            origin=origin,
            command=command,
        )

    def _valid_request(self) -> bytes:
        state = self.state()
        victim = self._victim()
        choices: list[msgspec.Struct] = [
            self._command(),
            # A plausible ack (the current term), in another node's name.
            Replicated(
                node_id=victim,
                index=state.last_index,
                term=state.master.term if state.master else 0,
            ),
            VoteRequest(term=_HUGE, candidate=victim, last_term=_HUGE, last_index=_HUGE),
            VoteRequest(term=_HUGE, candidate=self.me, last_term=_HUGE, last_index=_HUGE),
            ChunkBatch(
                chunks=tuple(
                    TextChunk(task_id=t, text=FORGED)
                    for t in [*state.tasks, TaskId(f"{FORGED}-task")][:4]
                )
            ),
            CatchUp(start=self.rng.randint(0, max(0, state.last_index)), limit=1 << 40),
        ]
        return encode(self.rng.choice(choices))

    def _valid_broadcast(self) -> tuple[str, bytes]:
        state = self.state()
        if self.rng.random() < 0.5:
            who = self.rng.choice([self.me, self._victim()])
            return ELECTION_TOPIC, encode(self._campaign(who))
        start = state.last_index + self.rng.choice([0, 1, 2])
        events = tuple(
            IndexedEvent(index=start + i, term=_HUGE, event=self._forged_event()) for i in range(3)
        )
        return EVENTS_TOPIC, encode(EventBatch(events=events, prev_term=0, committed=start + 2))

    def _noise(self, valid: bytes) -> bytes:
        kind = self.rng.randrange(3)
        if kind == 0:
            return self.rng.randbytes(self.rng.randint(0, 64))
        if kind == 1:
            return valid[: self.rng.randint(0, max(0, len(valid) - 1))]
        flipped = bytearray(valid)
        for _ in range(self.rng.randint(1, 4)):
            if flipped:
                flipped[self.rng.randrange(len(flipped))] = self.rng.randrange(256)
        return bytes(flipped)

    # -- sending and answering ---------------------------------------------------------------

    def _count(self, kind: str) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1

    async def send_one(self) -> None:
        """One message: a broadcast or a request, valid-but-forged or noise."""
        broadcast = self.rng.random() < 0.4
        if broadcast:
            topic, payload = self._valid_broadcast()
        else:
            topic, payload = "", self._valid_request()
        noisy = self.rng.random() < 0.35
        if noisy:
            payload = self._noise(payload)
        self._count(("broadcast" if broadcast else "request") + (" noise" if noisy else ""))
        try:
            if broadcast:
                await self.transport.publish(topic or ELECTION_TOPIC, payload)
            else:
                await self.transport.request(self._victim(), payload, timeout=2.0)
        except TransportError:
            pass

    async def answer(self, sender: str, payload: bytes) -> bytes:
        """What it says when an honest node asks it anything: lies or noise."""
        self._count("answer")
        lies: list[msgspec.Struct] = [
            Vote(granted=True),
            NotMaster(master=self.me),
            CommandResult(command_id=CommandId(FORGED), last_index=_HUGE),
            EventBatch(
                events=tuple(
                    IndexedEvent(index=i, term=_HUGE, event=self._forged_event()) for i in range(3)
                ),
                prev_term=_HUGE,
            ),
        ]
        valid = encode(self.rng.choice(lies))
        return self._noise(valid) if self.rng.random() < 0.6 else valid

    async def run(self, interval: tuple[float, float] = (0.01, 0.1)) -> None:
        """Send messages forever, answering requests with lies; cancel to stop."""
        self.transport.set_request_handler(self.answer)
        await self.transport.subscribe(ELECTION_TOPIC)
        await self.transport.subscribe(EVENTS_TOPIC)
        while True:
            await self.send_one()
            await anyio.sleep(self.rng.uniform(*interval))


__all__ = ["FORGED", "HostilePeer", "forged_builtin", "forged_card", "forged_in", "magnet"]
