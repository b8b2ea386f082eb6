"""The master's decisions: a command and the current state in, events out. Pure.

Refusals raise `CommandRefused` with an HTTP-like status and a message that says what was wrong.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import msgspec

from exo_core.bodies import without_body
from exo_core.coalesce import worth_logging
from exo_core.commands import (
    AddModelCard,
    CancelTask,
    Command,
    DeleteDownload,
    DeleteInstance,
    PlaceInstance,
    RemoveModelCard,
    ReportEvents,
    SubmitTask,
)
from exo_core.events import (
    DownloadDeleted,
    DownloadProgressed,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    ModelCardAdded,
    ModelCardRemoved,
    NodeTimedOut,
    TaskCreated,
    TaskStatusChanged,
)
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, new_id
from exo_core.model_cards import ModelCard
from exo_core.paths import model_id_problem
from exo_core.placement import replacement_options
from exo_core.placement_types import PlacementOption, PlacementRefused, PlacementRequest
from exo_core.reducer import apply
from exo_core.state import Instance, NodeInfo, ShardAssignment, State, TaskStatus
from exo_core.trust import builtin_card_refusal, instances_using, placement_view

# Ring ports of runner groups: RING_PORT_BASE .. RING_PORT_BASE + RING_PORT_SPAN - 1.
RING_PORT_BASE = 30100
RING_PORT_SPAN = 2000
# A card's source naming a hub repo: `hf:<repo>[@<revision>]` (the repo becomes a directory).
HUB_SOURCE = "hf:"


class CommandRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class MasterContext:
    """What the master consults besides state: the model cards and the placement hook, the
    ids of its built-in cards (never replaced from the cluster), and the nodes its operator
    excluded from every placement (`--exclude-node`)."""

    card: Callable[[ModelId], ModelCard | None]
    place: Callable[[ModelCard, PlacementRequest, State], list[PlacementOption]]
    builtin: Collection[ModelId] = ()
    exclude_nodes: Collection[NodeId] = field(default_factory=tuple)


@dataclass(frozen=True)
class Decision:
    events: list[Event]
    instance_id: InstanceId | None = None


def ring_ports(state: State, world_size: int, instance_id: str = "") -> list[int]:
    """Ports for a new ring: distinct from every existing instance's, and from each other (the
    ranks may share a host). The search starts at an offset derived from the instance id, so a
    re-placed instance (a new id) does not retry a port that something else on a host holds.
    The range sits below the ephemeral ports of Linux (32768+) and macOS/Windows (49152+)."""
    used = {
        int(s.ring_address.rsplit(":", 1)[1])
        for inst in state.instances.values()
        for s in inst.shards
        if s.ring_address
    }
    offset = zlib.crc32(instance_id.encode()) % RING_PORT_SPAN if instance_id else 0
    ports: list[int] = []
    for i in range(RING_PORT_SPAN):
        port = RING_PORT_BASE + (offset + i) % RING_PORT_SPAN
        if port not in used:
            ports.append(port)
            if len(ports) == world_size:
                return ports
    raise CommandRefused(503, f"no free ring ports left in {RING_PORT_BASE}+{RING_PORT_SPAN}")


def _subnet(address: str) -> str | None:
    parts = address.split(".")
    if len(parts) != 4 or address.startswith("127."):
        return None
    return ".".join(parts[:3])


def ring_host(node: NodeInfo | None, peers: list[NodeInfo]) -> str:
    """The address the other ranks reach `node` at: one on a subnet a peer is on (the first
    address may be a container bridge), else its first address; loopback when it has none."""
    if node is None or not node.addresses:
        return "127.0.0.1"
    peer_subnets = {_subnet(a) for p in peers for a in p.addresses} - {None}
    for address in node.addresses:
        if _subnet(address) in peer_subnets:
            return address
    return node.addresses[0]


def build_instance(state: State, option: PlacementOption, instance_id: InstanceId) -> Instance:
    """The instance of a placement: rank order is the option's, and with more than one rank
    each gets a `host:port` for the ring."""
    k = len(option.shares)
    ports = ring_ports(state, k, instance_id) if k > 1 else []
    members = [state.nodes[s.node_id] for s in option.shares if s.node_id in state.nodes]
    shards = []
    for rank, share in enumerate(option.shares):
        node = state.nodes.get(share.node_id)
        peers = [m for m in members if m.node_id != share.node_id]
        shards.append(
            ShardAssignment(
                node_id=share.node_id,
                runner_id=RunnerId(f"{instance_id}-r{rank}"),
                rank=rank,
                world_size=k,
                start_layer=share.start_layer,
                end_layer=share.end_layer,
                ring_address=f"{ring_host(node, peers)}:{ports[rank]}" if k > 1 else "",
            )
        )
    return Instance(
        instance_id=instance_id,
        model_id=option.model_id,
        sharding=option.sharding,
        shards=tuple(shards),
    )


def _unsafe_id(command: Command) -> str | None:
    """Why the command names a model that must never become a path, or None.

    Model ids become directory names on every node (a `DeleteDownload` removes one), so the
    master refuses unsafe ones from any API node or peer; nodes check again before acting."""
    match command:
        case PlaceInstance(model_id=model_id, card=card):
            names = [model_id, *(_card_names(card) if card is not None else [])]
        case DeleteDownload(model_id=model_id):
            names = [model_id]
        case RemoveModelCard(model_id=model_id):
            names = [model_id]
        case AddModelCard(card=card):
            names = _card_names(card)
        case ReportEvents(events=events):
            names = [name for event in events for name in _event_names(event)]
        case _:
            names = []
    for name in names:
        if (problem := model_id_problem(name)) is not None:
            return f"'{name}' is not a valid model id: {problem}"
    return None


def _card_names(card: ModelCard) -> list[str]:
    names: list[str] = [card.model_id]
    if card.source.startswith(HUB_SOURCE):
        names.append(card.source[len(HUB_SOURCE) :].partition("@")[0])
    return names


def _event_names(event: Event) -> list[str]:
    """Model ids in an event a node reports (a reported deletion is acted on like a command)."""
    match event:
        case DownloadDeleted(model_id=model_id) | ModelCardRemoved(model_id=model_id):
            return [model_id]
        case DownloadProgressed(progress=progress):
            return [progress.model_id]
        case ModelCardAdded(card=card):
            return _card_names(card)
        case _:
            return []


def decide(state: State, command: Command, ctx: MasterContext) -> Decision:
    if (problem := _unsafe_id(command)) is not None:
        raise CommandRefused(422, problem)
    match command:
        case PlaceInstance():
            known = ctx.card(command.model_id)
            card = known or command.card
            if card is None:
                raise CommandRefused(404, f"unknown model '{command.model_id}'")
            if card.model_id != command.model_id:
                raise CommandRefused(
                    422, f"the card is for '{card.model_id}', not '{command.model_id}'"
                )
            if command.instance_id in state.instances:
                raise CommandRefused(409, f"instance '{command.instance_id}' already exists")
            request = PlacementRequest(
                model_id=command.model_id,
                sharding=command.sharding,
                min_nodes=command.min_nodes,
                node_ids=command.node_ids,
            )
            excluded = (*command.exclude_nodes, *ctx.exclude_nodes)
            allowed = placement_view(state, command.nodes, excluded)
            if not allowed.nodes and state.nodes:
                raise CommandRefused(409, f"cannot place {command.model_id}: no node is allowed")
            try:
                options = ctx.place(card, request, allowed)
            except PlacementRefused as e:
                raise CommandRefused(409, f"cannot place {command.model_id}: {e}") from e
            instance_id = command.instance_id or InstanceId(new_id("inst"))
            instance = msgspec.structs.replace(
                build_instance(state, options[0], instance_id),
                nodes=command.nodes,
                exclude_nodes=command.exclude_nodes,
            )
            created = InstanceCreated(instance=instance)
            if known is None:
                # A card from a plugin the master lacks: replicated, so every node (and any
                # later master, replacing the instance after a node loss) knows the model.
                return Decision([ModelCardAdded(card=card), created], instance_id)
            return Decision([created], instance_id)
        case DeleteInstance():
            if command.instance_id not in state.instances:
                raise CommandRefused(404, f"unknown instance '{command.instance_id}'")
            # Failed, with the reason (such as the runner's last error): the callers' dialects
            # answer a 5xx that says what failed.
            events: list[Event] = [
                TaskStatusChanged(
                    task_id=t.task_id,
                    status=TaskStatus.FAILED,
                    error=f"the instance was deleted: {command.reason}",
                )
                for t in state.tasks.values()
                if t.instance_id == command.instance_id
            ]
            events.append(InstanceDeleted(instance_id=command.instance_id, reason=command.reason))
            return Decision(events, command.instance_id)
        case SubmitTask():
            if command.task.instance_id not in state.instances:
                raise CommandRefused(404, f"unknown instance '{command.task.instance_id}'")
            if command.task.task_id in state.tasks:
                return Decision([])  # a retried submission
            # Request text never enters the log, whoever sent the command.
            return Decision([TaskCreated(task=without_body(command.task))])
        case CancelTask():
            if command.task_id not in state.tasks:
                return Decision([])  # already finished: cancelling is idempotent
            return Decision(
                [TaskStatusChanged(task_id=command.task_id, status=TaskStatus.CANCELLED)]
            )
        case AddModelCard():
            if (refusal := builtin_card_refusal(command.card, ctx.builtin)) is not None:
                raise CommandRefused(409, refusal)
            return Decision([ModelCardAdded(card=command.card)])
        case RemoveModelCard():
            if command.model_id not in state.model_cards:
                raise CommandRefused(404, f"no custom model '{command.model_id}'")
            return Decision([ModelCardRemoved(model_id=command.model_id)])
        case DeleteDownload():
            in_use = instances_using(state, command.node_id, command.model_id, ctx.card)
            if in_use:
                raise CommandRefused(
                    409,
                    f"{command.model_id} is in use on {command.node_id} by instance "
                    f"{', '.join(in_use)}; delete the instance first",
                )
            return Decision([DownloadDeleted(node_id=command.node_id, model_id=command.model_id)])
        case ReportEvents():
            return Decision(news(state, command.events))


def _preview(state: State, event: Event) -> State:
    """The state after `event`, for deciding what follows it (the real index comes later)."""
    return apply(state, IndexedEvent(index=state.last_index + 1, term=0, event=event))


def news(state: State, reports: Iterable[Event]) -> list[Event]:
    """The reported events worth logging, each judged against the state the earlier ones
    leave (see `exo_core.coalesce`)."""
    kept: list[Event] = []
    for event in reports:
        if worth_logging(state, event):
            kept.append(event)
            state = _preview(state, event)
    return kept


def decide_node_timeout(state: State, node_id: NodeId, ctx: MasterContext) -> list[Event]:
    """A node went silent: delete the instances that used it, remove it, and re-place each
    deleted instance on the nodes left when the model still fits there."""
    gone = [i for i in state.instances.values() if i.shard_on(node_id) is not None]
    events: list[Event] = [
        InstanceDeleted(instance_id=i.instance_id, reason=f"node {node_id} timed out") for i in gone
    ]
    events.append(NodeTimedOut(node_id=node_id))
    after = state
    for event in events:
        after = _preview(after, event)
    for instance in gone:
        card = ctx.card(instance.model_id)
        if card is None:
            continue
        # Its own sharding first, then any: a tensor group that lost a node may now only
        # fit as a pipeline. Nothing fits: callers get errors until someone places it again.
        # Only where the operator let it be placed in the first place.
        allowed = placement_view(
            after, instance.nodes, (*instance.exclude_nodes, *ctx.exclude_nodes)
        )
        options = replacement_options(card, instance, allowed, ctx.place)
        if not options:
            continue
        created = InstanceCreated(
            instance=msgspec.structs.replace(
                build_instance(after, options[0], InstanceId(new_id("inst"))),
                nodes=instance.nodes,
                exclude_nodes=instance.exclude_nodes,
            )
        )
        after = _preview(after, created)
        events.append(created)
    return events
