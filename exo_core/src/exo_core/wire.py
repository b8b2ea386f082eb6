"""Messages between nodes. Broadcasts go on topics; everything else is a request."""

from __future__ import annotations

import msgspec

from exo_core.commands import CommandEnvelope, CommandResult
from exo_core.events import IndexedEvent
from exo_core.generation import Chunk
from exo_core.ids import NodeId

EVENTS_TOPIC = "exo/events"
ELECTION_TOPIC = "exo/election"


class EventBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Indexed events broadcast by the master (or sent in answer to a catch-up)."""

    events: tuple[IndexedEvent, ...]


class CatchUp(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask a node for the events from `start` on, at most `limit` of them."""

    start: int
    limit: int = 5000


class ChunkBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Data plane: generated chunks for tasks whose caller is on the receiving node."""

    chunks: tuple[Chunk, ...]


class Ack(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class NotMaster(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The node asked to run a command is not the master; it names the one it knows."""

    master: NodeId | None


class Campaign(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A node's bid in an election; see `exo_core.election`."""

    node_id: NodeId
    term: int
    force_master: bool
    priority: int
    seniority: int
    commands_seen: int
    is_master: bool


Request = CommandEnvelope | CatchUp | ChunkBatch
Response = CommandResult | EventBatch | Ack | NotMaster
Broadcast = EventBatch | Campaign

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(Request).decode
decode_response = msgspec.msgpack.Decoder(Response).decode
decode_broadcast = msgspec.msgpack.Decoder(Broadcast).decode
