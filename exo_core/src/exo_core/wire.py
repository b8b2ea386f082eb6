"""Messages between nodes. Broadcasts go on topics; everything else is a request."""

from __future__ import annotations

from typing import Annotated

import msgspec

from exo_core.commands import CommandEnvelope, CommandResult
from exo_core.events import IndexedEvent
from exo_core.generation import Chunk, GenerationParams
from exo_core.ids import NodeId, TaskId
from exo_core.images import ImageRequest
from exo_core.snapshot import Snapshot
from exo_core.terms import MAX_TERM

EVENTS_TOPIC = "exo/events"
ELECTION_TOPIC = "exo/election"

# Bounds on numbers peers send: a term or index past 2**62 is a forgery (it would take
# centuries to reach), and arithmetic on it must never overflow what msgpack can carry.
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_TERM)]
Index = Annotated[int, msgspec.Meta(ge=-1, le=MAX_TERM)]
# The most events, and about the most bytes, one catch-up answer carries, whatever the asker
# wants (a transport carries 64 MiB at most).
MAX_CATCH_UP_EVENTS = 5000
MAX_CATCH_UP_BYTES = 8 << 20


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

    start: Count
    prev_term: Count = 0
    limit: Annotated[int, msgspec.Meta(ge=1)] = MAX_CATCH_UP_EVENTS


class Diverged(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The asker's log does not match at `start - 1`: it must cut its tail and ask again."""


class Replicated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A follower tells the master it holds, durably, a log whose event `index` has `term`.

    Logs that agree on one (index, term) agree on everything before it, so the master counts
    the follower as holding its own log up to `index` only when its own event there matches."""

    node_id: NodeId
    index: Index
    term: Count


class VoteRequest(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A candidate asks for a vote in `term`, showing how complete its log is."""

    term: Count
    candidate: NodeId
    last_term: Count
    last_index: Index


class Vote(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    granted: bool
    reason: str = ""


class ChunkBatch(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Data plane: generated chunks for tasks whose caller is on the receiving node."""

    chunks: Annotated[tuple[Chunk, ...], msgspec.Meta(max_length=1024)]


class FetchBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Data plane: rank 0 of a task's instance asks the task's origin node for its body."""

    task_id: TaskId


class TaskBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    task_id: TaskId
    params: GenerationParams
    image: ImageRequest | None = None


class NoBody(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The origin node does not hand out the body (no caller waits for it, or not to you)."""

    reason: str


class Ack(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class Refused(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The request was not accepted from this sender (see `exo_core.peer_auth`), or it came
    while the sender already had too many requests in flight."""

    reason: str


class NotMaster(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The node asked to run a command is not the master; it names the one it knows."""

    master: NodeId | None


class Campaign(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A node's bid in an election; see `exo_core.election`.

    `term` is a master's own term, or the term of the last event in a follower's log;
    `commands_seen` is the length of its log; `members` how many nodes it knows in the cluster."""

    node_id: NodeId
    term: Count
    force_master: bool
    priority: int
    seniority: Count
    commands_seen: Count
    is_master: bool
    members: Annotated[int, msgspec.Meta(ge=1, le=1 << 16)] = 1
    # The highest term it has voted in: a new term must be above every vote cast.
    voted_term: Count = 0
    # Whom it voted for in `voted_term`: a node follows only the master it voted for.
    voted_for: NodeId | None = None


Request = CommandEnvelope | CatchUp | ChunkBatch | FetchBody | Replicated | VoteRequest
Response = (
    CommandResult
    | EventBatch
    | Snapshot
    | TaskBody
    | NoBody
    | Ack
    | NotMaster
    | Diverged
    | Vote
    | Refused
)
Broadcast = EventBatch | Campaign

encode = msgspec.msgpack.Encoder().encode
decode_request = msgspec.msgpack.Decoder(Request).decode
decode_response = msgspec.msgpack.Decoder(Response).decode
decode_broadcast = msgspec.msgpack.Decoder(Broadcast).decode


def encode_catch_up(
    events: list[IndexedEvent], prev_term: int, max_bytes: int, committed: int = -1
) -> bytes:
    """A catch-up answer of the first of `events` that fit in `max_bytes` (at least one: the
    asker must make progress); the asker asks again for the rest."""
    while True:
        raw = encode(EventBatch(events=tuple(events), prev_term=prev_term, committed=committed))
        if len(raw) <= max_bytes or len(events) <= 1:
            return raw
        events = events[: len(events) // 2]
