"""A command is applied once even when its sender asks the next master again.

The sender of a command that got no answer (its master was cut off, paused or killed after
logging it) sends it again, with the same id, to whoever is master now. The events of the
first send may have reached the new master: it must answer from them, not decide again. The
network fault tests caught a write logged twice this way under load."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.msgpack import encode

from exo_core.commands import CommandEnvelope, DeleteDownload
from exo_core.decide import MasterContext
from exo_core.eventlog import EventLog
from exo_core.events import DownloadDeleted, IndexedEvent, MasterElected
from exo_core.ids import CommandId, ModelId, NodeId
from exo_core.master import Master
from exo_core.replica import Replica
from exo_core.snapshot import SnapshotStore

pytestmark = pytest.mark.anyio
CTX = MasterContext(card=lambda m: None, place=lambda card, request, state: [])


def open_replica(root: Path) -> Replica:
    root.mkdir(exist_ok=True)
    return Replica(EventLog(root / "events.log", fsync=False), SnapshotStore(root / "snap.bin"))


def envelope(key: str) -> CommandEnvelope:
    command = DeleteDownload(node_id=NodeId("b"), model_id=ModelId(f"history/{key}"))
    return CommandEnvelope(command_id=CommandId(f"cmd-{key}"), origin=NodeId("c"), command=command)


def deletions(replica: Replica) -> list[str]:
    return [e.event.model_id for e in replica.log.read() if isinstance(e.event, DownloadDeleted)]


async def nothing(events: tuple[IndexedEvent, ...], prev_term: int, commit: int) -> None:
    return None


async def test_a_retry_through_the_next_master_is_answered_from_the_log(tmp_path: Path) -> None:
    old_replica, new_replica = open_replica(tmp_path / "a"), open_replica(tmp_path / "b")

    async def to_b(events: tuple[IndexedEvent, ...], prev_term: int, commit: int) -> None:
        new_replica.ingest(events, prev_term)

    old = Master(NodeId("a"), 1, old_replica, CTX, to_b)
    await old.start()
    first = await old.handle(envelope("op-1"))
    assert first.ok and deletions(new_replica) == ["history/op-1"]

    new = Master(NodeId("b"), 2, new_replica, CTX, nothing)
    await new.start()
    again = await new.handle(envelope("op-1"))
    assert again.ok and again.last_index == first.last_index
    other = await new.handle(envelope("op-2"))  # a new command is still decided
    assert other.ok and other.last_index > again.last_index
    assert deletions(new_replica) == ["history/op-1", "history/op-2"]
    assert new.commands_seen == 1


async def test_a_restarted_master_still_knows_the_commands_of_its_log(tmp_path: Path) -> None:
    replica = open_replica(tmp_path / "a")
    master = Master(NodeId("a"), 1, replica, CTX, nothing)
    await master.start()
    first = await master.handle(envelope("op-7"))
    replica.log.close()

    reopened = open_replica(tmp_path / "a")
    assert reopened.command_events(CommandId("cmd-op-7")) == (first.last_index, first.last_index)
    master = Master(NodeId("a"), 2, reopened, CTX, nothing)
    await master.start()
    again = await master.handle(envelope("op-7"))
    assert again.last_index == first.last_index and deletions(reopened) == ["history/op-7"]


def test_an_event_of_no_command_is_encoded_as_before() -> None:
    """Logs written before events named their command read the same, and the master's own
    events cost no extra bytes."""
    plain = IndexedEvent(index=0, term=1, event=MasterElected(node_id=NodeId("a"), term=1))
    assert b"command_id" not in encode(plain)
    tagged = IndexedEvent(index=1, term=1, event=plain.event, command_id=CommandId("cmd-x"))
    assert b"cmd-x" in encode(tagged)
