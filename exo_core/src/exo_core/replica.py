"""A node's copy of the cluster state: the durable log, the state, and who waits on them.

Events arrive from the master in any order, duplicated or not. `ingest` applies exactly the
next index, buffers what comes early and ignores what it has already seen. Each event carries
the term of the master that indexed it, and each batch the term of the event just before it:
a follower whose log does not match there holds events that no longer count (from a master
that lost its place) and must cut them off and catch up.

Every `snapshot_every` events the replica remembers its state; once it learns that the index
of that state is committed (held by a majority, so never cut again), it writes the state as a
snapshot beside the log and cuts the log behind it. A restart loads the snapshot and replays
the tail; a peer whose log ends before ours starts receives the snapshot (`install`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from enum import Enum

import anyio
from loguru import logger

from exo_core.eventlog import CorruptLog, EventLog
from exo_core.events import IndexedEvent
from exo_core.ids import CommandId
from exo_core.reducer import apply
from exo_core.snapshot import Snapshot, SnapshotStore
from exo_core.state import State
from exo_core.term_history import TermHistory

Listener = Callable[[IndexedEvent, State], None]
SNAPSHOT_EVERY = 10_000
# Commands whose events the replica remembers (a retry comes within seconds of its first send).
REMEMBERED_COMMANDS = 10_000


class Ingested(Enum):
    UP_TO_DATE = "up_to_date"
    # Events past a gap wait in a buffer; ask the master for the missing ones.
    GAP = "gap"
    # Our log disagrees with the master's; cut our tail (see `divergence_point`) and catch up.
    DIVERGED = "diverged"


class Replica:
    def __init__(
        self,
        log: EventLog,
        snapshots: SnapshotStore | None = None,
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.log = log
        self.snapshots = snapshots or SnapshotStore(log.path.with_name("snapshot.bin"))
        self.snapshot_every = snapshot_every
        # The snapshot the log continues (None: the log starts at index 0).
        self.snapshot: Snapshot | None = None
        # The highest index known to be on a majority of the cluster.
        self.committed = -1
        # Our state at an index not yet known to be committed: the next snapshot.
        self._candidate: Snapshot | None = None
        self.state = State()
        self._terms = TermHistory()
        # command id -> (first, last) index of its events, for the commands of the log's tail.
        self._commands: OrderedDict[CommandId, tuple[int, int]] = OrderedDict()
        self._early: dict[int, tuple[IndexedEvent, int]] = {}  # index -> (event, prev term)
        self._listeners: list[Listener] = []
        self._changed = anyio.Event()
        started = time.perf_counter()
        self._load()
        if self.next_index:
            logger.info(
                f"loaded {self.next_index} events ({log.next_index - log.first_index} replayed "
                f"from {log.path}) in {time.perf_counter() - started:.2f}s"
            )

    def _load(self) -> None:
        snapshot = self.snapshots.load()
        if snapshot is not None:
            if self.log.first_index > snapshot.next_index:
                raise CorruptLog(
                    f"{self.log.path} starts at {self.log.first_index}, after the snapshot's "
                    f"last event {snapshot.last_index}"
                )
            held = self.log.read(snapshot.last_index, snapshot.next_index)
            if held and held[0].term != snapshot.last_term:
                self.log.clear(snapshot.next_index)  # a tail from a history the snapshot replaced
            self.log.compact(snapshot.next_index)  # a crash may have come before the cut
            self.snapshot = snapshot
            self.committed = snapshot.last_index
        elif self.log.first_index > 0:
            raise CorruptLog(f"{self.log.path} starts at {self.log.first_index} without a snapshot")
        self._rebuild()

    def _rebuild(self) -> None:
        """The state of the snapshot, then every event of the log."""
        if self.snapshot is not None:
            state, terms = self.snapshot.state, self.snapshot.history()
        else:
            state, terms = State(), TermHistory()
        self._commands.clear()
        for event in self.log:
            state = apply(state, event)
            terms.append(event.term)
            self._remember_command(event)
        self.state, self._terms = state, terms

    def _remember_command(self, event: IndexedEvent) -> None:
        if (command_id := event.command_id) is None:
            return
        first, _ = self._commands.get(command_id, (event.index, event.index))
        self._commands[command_id] = (first, event.index)
        if len(self._commands) > REMEMBERED_COMMANDS:
            self._commands.popitem(last=False)

    def command_events(self, command_id: CommandId) -> tuple[int, int] | None:
        """The first and last index of the events of the command `command_id`, if the log's
        tail holds it: a command retried through another master than the one that took it."""
        return self._commands.get(command_id)

    @property
    def next_index(self) -> int:
        return self._terms.next_index

    @property
    def first_index(self) -> int:
        """The first index still in the log; earlier events are only in the snapshot."""
        return self.log.first_index

    @property
    def last_term(self) -> int:
        return self._terms.last_term

    def term_at(self, index: int) -> int:
        """The term of the event at `index`; 0 before the first event; -1 past the end."""
        return self._terms.term_at(index)

    def divergence_point(self) -> int:
        """Where to cut after a mismatch: the first index of our last term, but not what we
        know is committed. With nothing above that left to cut, our committed events are
        another cluster's (two clusters that formed apart), and their whole term goes."""
        point = max(self._terms.last_run_start(), self.committed + 1)
        return point if point < self.next_index else self._terms.last_run_start()

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after each applied event. Returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def ingest(self, events: Sequence[IndexedEvent], prev_term: int | None = None) -> Ingested:
        """Apply what can be applied. `prev_term` is the term of the event before `events[0]`
        (None: unknown, so the events are taken as they come)."""
        previous = prev_term
        for event in events:
            known = self.term_at(event.index)
            if event.index < self.next_index:
                if known != event.term:
                    self._early.clear()
                    return Ingested.DIVERGED
            elif previous is not None or event.index not in self._early:
                self._early[event.index] = (event, previous if previous is not None else -2)
            previous = event.term
        ready: list[IndexedEvent] = []
        index = self.next_index
        last = self.last_term
        while index in self._early:
            event, before = self._early.pop(index)
            if (before != -2 and before != last) or event.term < last:
                self._early.clear()
                self._commit(ready)
                return Ingested.DIVERGED
            ready.append(event)
            last = event.term
            index += 1
        self._commit(ready)
        return Ingested.GAP if self._early else Ingested.UP_TO_DATE

    def _commit(self, ready: list[IndexedEvent]) -> None:
        if not ready:
            return
        self.log.append(ready)
        for event in ready:
            self.state = apply(self.state, event)
            self._terms.append(event.term)
            self._remember_command(event)
            for listener in list(self._listeners):
                try:
                    listener(event, self.state)
                except Exception:
                    logger.exception(f"event listener failed on event {event.index}")
        base = self.snapshot.last_index if self.snapshot is not None else -1
        if self._candidate is None and self.state.last_index - base >= self.snapshot_every:
            self._candidate = Snapshot(state=self.state, terms=self._terms.runs())
            self._snapshot_if_committed()
        self._changed.set()
        self._changed = anyio.Event()

    # -- snapshots ----------------------------------------------------------------------------

    def mark_committed(self, index: int) -> None:
        """Every event up to `index` of our log is on a majority of the cluster."""
        index = min(index, self.state.last_index)
        if index > self.committed:
            self.committed = index
            self._snapshot_if_committed()

    def _snapshot_if_committed(self) -> None:
        candidate = self._candidate
        if candidate is None or candidate.last_index > self.committed:
            return
        self._candidate = None
        started = time.perf_counter()
        self.snapshots.save(candidate)
        self.log.compact(candidate.next_index)
        self.snapshot = candidate
        logger.debug(
            f"snapshot at event {candidate.last_index}, log cut behind it "
            f"in {(time.perf_counter() - started) * 1e3:.1f} ms"
        )

    def install(self, snapshot: Snapshot) -> None:
        """Take a peer's snapshot in place of everything we hold: our log ends before it (or
        diverged from the cluster's), and the peer has cut the events we miss."""
        logger.info(f"installing a snapshot at event {snapshot.last_index}")
        self.snapshots.save(snapshot)
        self.log.clear(snapshot.next_index)
        self.snapshot = snapshot
        self.state, self._terms = snapshot.state, snapshot.history()
        self._commands.clear()
        self.committed = max(self.committed, snapshot.last_index)
        self._candidate = None
        self._early.clear()
        self._changed.set()
        self._changed = anyio.Event()

    def truncate(self, next_index: int) -> None:
        """Forget events from `next_index` on: they were never committed by the cluster."""
        if next_index >= self.next_index:
            return
        logger.warning(
            f"dropping {self.next_index - next_index} uncommitted events from {next_index}"
        )
        if self._candidate is not None and self._candidate.last_index >= next_index:
            self._candidate = None
        if next_index < self.log.first_index:
            # Only a log of another cluster diverges inside a snapshot (two clusters that
            # formed apart): drop it all and take the master's snapshot and log.
            logger.warning("our snapshot holds events the cluster does not: starting over")
            self.log.clear(0)
            self.snapshots.delete()
            self.snapshot = None
            self.committed = -1
        else:
            self.log.truncate(next_index)
        self._early.clear()
        self._rebuild()
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, index: int, timeout: float | None = None) -> bool:
        """Wait until the event `index` is applied. False on timeout."""
        with anyio.move_on_after(timeout):
            while self.state.last_index < index:
                await self._changed.wait()
            return True
        return False

    async def wait_change(self) -> None:
        await self._changed.wait()
