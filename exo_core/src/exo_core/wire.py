"""Messages between nodes. Broadcasts go on topics; everything else is a request."""

from __future__ import annotations

import msgspec

from exo_core.commands import CommandEnvelope, CommandResult
from exo_core.events import IndexedEvent
from exo_core.generation import Chunk, GenerationParams
from exo_core.ids import NodeId, TaskId
from exo_core.snapshot import Snapshot

EVENTS_TOPIC = "exo/events"
ELECTION_TOPIC = "exo/election"


class EventBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Indexed events broadcast by the master (or sent in answer to a catch-up).

    `prev_term` is the term of the event just before the first one (0 before index 0), so a
    follower can tell whether its log matches the master's up to there."""

    events: tuple[IndexedEvent, ...]
    prev_term: int = 0
    # The master's commit index: every event up to here is on a majority of the cluster.
    committed: int = -1


class CatchUp(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Ask for the events from `start` on (at most `limit`); `prev_term` is the asker's term at
    `start - 1`, so the answer can say when the asker's log diverges. When the answering node
    has cut `start` from its log, it answers its `Snapshot` instead, and the asker continues
    after it."""

    start: int
    prev_term: int = 0
    limit: int = 5000


class Diverged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The asker's log does not match at `start - 1`: it must cut its tail and ask again."""


class Replicated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A follower tells the master it holds, durably, a log whose event `index` has `term`.

    Logs that agree on one (index, term) agree on everything before it, so the master counts
    the follower as holding its own log up to `index` only when its own event there matches."""

    node_id: NodeId
    index: int
    term: int


class VoteRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A candidate asks for a vote in `term`, showing how complete its log is."""

    term: int
    candidate: NodeId
    last_term: int
    last_index: int


class Vote(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    granted: bool
    reason: str = ""


class ChunkBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Data plane: generated chunks for tasks whose caller is on the receiving node."""

    chunks: tuple[Chunk, ...]


class FetchBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Data plane: rank 0 of a task's instance asks the task's origin node for its body."""

    task_id: TaskId


class TaskBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    task_id: TaskId
    params: GenerationParams


class NoBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The origin node does not hand out the body (no caller waits for it, or not to you)."""

    reason: str


class Ack(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class NotMaster(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The node asked to run a command is not the master; it names the one it knows."""

    master: NodeId | None


class Campaign(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A node's bid in an election; see `exo_core.election`.

    `term` is a master's own term, or the term of the last event in a follower's log;
    `commands_seen` is the length of its log; `members` how many nodes it knows in the cluster."""

    node_id: NodeId
    term: int
    force_master: bool
    priority: int
    seniority: int
    commands_seen: int
    is_master: bool
    members: int = 1
    # The highest term it has voted in: a new term must be above every vote cast.
    voted_term: int = 0


Request = CommandEnvelope | CatchUp | ChunkBatch | FetchBody | Replicated | VoteRequest
Response = (
    CommandResult | EventBatch | Snapshot | TaskBody | NoBody | Ack | NotMaster | Diverged | Vote
)
Broadcast = EventBatch | Campaign

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(Request).decode
decode_response = msgspec.msgpack.Decoder(Response).decode
decode_broadcast = msgspec.msgpack.Decoder(Broadcast).decode
