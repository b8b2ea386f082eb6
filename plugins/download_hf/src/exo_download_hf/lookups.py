"""Hub look-ups for the API (search, a repo's files and config) on threads of their own.

They used to run on the event loop's shared worker threads (anyio's default: 40), with no
timeout on a search: 45 searches against a hub that did not answer took every thread, so an
unrelated `DELETE /download` (which deletes on a worker thread) waited for them, and so did
shutdown. Here:

- at most `LOOKUP_WORKERS` look-ups run at once, each on a daemon thread of its own; one more
  is refused at once (503) rather than queued;
- each hub call has a short timeout (`hub.LOOKUP_TIMEOUT_S`), and the caller waits at most
  `WAIT_S` for the whole look-up (504), even if a call hangs past its timeout;
- nothing waits on a look-up's thread: not the other routes (they use other threads), not
  shutdown (the threads are daemons; a slot comes back when its thread ends).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from exo_download_hf.hub import LOOKUP_TIMEOUT_S, HubError

T = TypeVar("T")

LOOKUP_WORKERS = 8
# How long a route waits for a whole look-up (a card takes up to four calls).
WAIT_S = 20.0


class LookupsBusy(HubError):
    status = 503


class LookupTimedOut(HubError):
    status = 504


class HubLookups:
    def __init__(self, workers: int = LOOKUP_WORKERS, wait_s: float = WAIT_S) -> None:
        self.workers = workers
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    async def run(self, what: str, call: Callable[[], T]) -> T:
        """`call()` on a look-up thread; raises `LookupsBusy` when all are taken,
        `LookupTimedOut` after `wait_s`, or what `call` raised."""
        with self._lock:
            if self._running >= self.workers:
                raise LookupsBusy(
                    f"{what}: {self._running} hub look-ups are in flight already; retry shortly"
                )
            self._running += 1
        done = anyio.Event()
        outcome: list[tuple[bool, Any]] = []
        token = anyio.lowlevel.current_token()

        def work() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as e:  # handed to the caller
                outcome.append((False, e))
            finally:
                with self._lock:
                    self._running -= 1
                # When the loop is gone (the node stopped), nobody waits any more.
                with contextlib.suppress(Exception):
                    anyio.from_thread.run_sync(done.set, token=token)

        threading.Thread(target=work, name=f"hub look-up: {what[:60]}", daemon=True).start()
        with anyio.move_on_after(self.wait_s):
            await done.wait()
        if not outcome:
            raise LookupTimedOut(f"{what}: the hub did not answer within {self.wait_s:.0f} s")
        ok, value = outcome[0]
        if ok:
            return value  # type: ignore[no-any-return]
        raise value


__all__ = ["LOOKUP_TIMEOUT_S", "LOOKUP_WORKERS", "HubLookups", "LookupTimedOut", "LookupsBusy"]
