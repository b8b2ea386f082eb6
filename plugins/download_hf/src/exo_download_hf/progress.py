"""Download progress: what a fetch has done so far, and its speed over a recent window."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

# Speed is averaged over this many seconds, so one slow chunk does not swing the ETA.
SPEED_WINDOW_S = 5.0


class Cancelled(Exception):
    """The download was abandoned (its caller was cancelled, or the model is being deleted)."""


class Tally:
    """Bytes of one model on disk, updated by the fetching thread and read by the event loop.

    `base` counts files already complete; `current` the file being written. One thread writes
    the counters and plain int stores are atomic in CPython, so they need no lock."""

    def __init__(self) -> None:
        self.total = 0
        self.base = 0
        self.current = 0
        # Bytes received from the network by this process: the speed is measured on these, so
        # bytes resumed from disk never count as fetched fast.
        self.fetched = 0
        self.cancelled = threading.Event()
        # Why it stops when `cancelled` is set (a deletion, or a cancel by request).
        self.stop_reason = "the model is being deleted"

    @property
    def done(self) -> int:
        return self.base + self.current

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled(self.stop_reason)


class SpeedMeter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, done: int) -> float:
        """Record `done` bytes now; the bytes per second over the window."""
        now = self._clock()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        t0, d0 = self._samples[0]
        return max(0.0, (done - d0) / (now - t0)) if now > t0 else 0.0
