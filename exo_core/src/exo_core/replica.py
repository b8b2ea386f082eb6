"""A node's copy of the cluster state: the durable log, the state, and who waits on them.

Events arrive from the master in any order, duplicated or not. `ingest` applies exactly the
next index, buffers what comes early and ignores what it has already seen. Each event carries
the term of the master that indexed it, and each batch the term of the event just before it:
a follower whose log does not match there holds events that no longer count (from a master
that lost its place) and must cut them off and catch up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import Enum

import anyio
from loguru import logger

from exo_core.eventlog import EventLog
from exo_core.events import IndexedEvent
from exo_core.reducer import apply
from exo_core.state import State

Listener = Callable[[IndexedEvent, State], None]


class Ingested(Enum):
    UP_TO_DATE = "up_to_date"
    # Events past a gap wait in a buffer; ask the master for the missing ones.
    GAP = "gap"
    # Our log disagrees with the master's; cut our tail (see `divergence_point`) and catch up.
    DIVERGED = "diverged"


class Replica:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.state = State()
        self._terms: list[int] = []  # term of each event in the log, by index
        self._early: dict[int, tuple[IndexedEvent, int]] = {}  # index -> (event, prev term)
        self._listeners: list[Listener] = []
        self._changed = anyio.Event()
        started = time.perf_counter()
        self._rebuild()
        if log.next_index:
            logger.info(
                f"replayed {log.next_index} events from {log.path} "
                f"in {time.perf_counter() - started:.2f}s"
            )

    def _rebuild(self) -> None:
        state, terms = State(), []
        for event in self.log:
            state = apply(state, event)
            terms.append(event.term)
        self.state, self._terms = state, terms

    @property
    def next_index(self) -> int:
        return len(self._terms)

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else 0

    def term_at(self, index: int) -> int:
        """The term of the event at `index`; 0 before the first event; -1 past the end."""
        if index < 0:
            return 0
        return self._terms[index] if index < len(self._terms) else -1

    def divergence_point(self) -> int:
        """Where to cut after a mismatch: the first index of our last term."""
        term = self.last_term
        index = self.next_index
        while index > 0 and self._terms[index - 1] == term:
            index -= 1
        return index

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
            for listener in list(self._listeners):
                try:
                    listener(event, self.state)
                except Exception:
                    logger.exception(f"event listener failed on event {event.index}")
        self._changed.set()
        self._changed = anyio.Event()

    def truncate(self, next_index: int) -> None:
        """Forget events from `next_index` on: they were never committed by the cluster."""
        if next_index >= self.next_index:
            return
        logger.warning(
            f"dropping {self.next_index - next_index} uncommitted events from {next_index}"
        )
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
