"""A node's copy of the cluster state: the durable log, the state, and who waits on them.

Events arrive from the master in any order, duplicated or not: `ingest` applies exactly the
next index, buffers what comes early and ignores what it has already seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
from loguru import logger

from exo_core.eventlog import EventLog
from exo_core.events import IndexedEvent
from exo_core.reducer import apply
from exo_core.state import State

Listener = Callable[[IndexedEvent, State], None]


class Replica:
    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.state = State()
        self._early: dict[int, IndexedEvent] = {}
        self._listeners: list[Listener] = []
        self._changed = anyio.Event()
        self.last_term = 0
        started = time.perf_counter()
        for event in log:
            self.state = apply(self.state, event)
            self.last_term = event.term
        if log.next_index:
            logger.info(
                f"replayed {log.next_index} events from {log.path} "
                f"in {time.perf_counter() - started:.2f}s"
            )

    @property
    def next_index(self) -> int:
        return self.state.last_index + 1

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` after each applied event. Returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def ingest(self, events: list[IndexedEvent] | tuple[IndexedEvent, ...]) -> bool:
        """Apply what can be applied; returns True if a gap remains (time to catch up)."""
        for event in events:
            if event.index >= self.next_index:
                self._early[event.index] = event
        ready: list[IndexedEvent] = []
        index = self.next_index
        while index in self._early:
            ready.append(self._early.pop(index))
            index += 1
        if ready:
            self.log.append(ready)
            for event in ready:
                self.state = apply(self.state, event)
                self.last_term = event.term
                for listener in list(self._listeners):
                    try:
                        listener(event, self.state)
                    except Exception:
                        logger.exception(f"event listener failed on event {event.index}")
            self._changed.set()
            self._changed = anyio.Event()
        return bool(self._early)

    def replace_tail(self, next_index: int) -> None:
        """Forget events from `next_index` on (they were never committed by the new master)."""
        if next_index >= self.next_index:
            return
        self.log.truncate(next_index)
        self._early.clear()
        state = State()
        for event in self.log:
            state = apply(state, event)
        self.state = state

    async def wait_for(self, index: int, timeout: float | None = None) -> bool:
        """Wait until the event `index` is applied. False on timeout."""
        with anyio.move_on_after(timeout):
            while self.state.last_index < index:
                await self._changed.wait()
            return True
        return False

    async def wait_change(self) -> None:
        await self._changed.wait()
