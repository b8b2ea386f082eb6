"""Deadlines for the runner's group work: a collective that never completes ends the process.

A peer that dies closes its sockets and MLX fails the collective at once; a peer that vanishes
(a cable pulled, a frozen machine) would leave us blocked forever. The watchdog thread turns
that into a runner failure with a clear message. It works because `mx.eval` releases the GIL
while it waits. `mx.distributed.init` does not, so forming the group is guarded by
`faulthandler`'s C-level timer instead (see `exo_core.ring.form_group`).

MLX does not always fail the collective: a ring socket's thread that saw the peer go fails
the tasks it holds and ends, and a collective queued on that socket afterwards (the next
step's, on another stream) waits forever. So a guarded wait that lasts past `probe_after_s`
also asks a probe (`watch`: the ring's connections, `exo_core.ring.ring_peers_lost`) whether
a peer is gone, and ends the process with its words at once instead of at the deadline.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CODE = 3


class Watchdog:
    """Ends the process when guarded work (a collective) outlives its deadline."""

    def __init__(
        self, on_expire: Callable[[str], None], poll_s: float = 0.2, probe_after_s: float = 1.0
    ) -> None:
        """`on_expire(message)` reports the failure; the process exits right after it."""
        self._on_expire = on_expire
        self._poll_s = poll_s
        self._probe_after_s = probe_after_s
        self._probe: Callable[[], str | None] | None = None
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._since = 0.0
        self._what = ""
        self._timeout_s = 0.0
        self._thread = threading.Thread(target=self._run, name="exo-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str, timeout_s: float) -> Iterator[None]:
        """Within the block, `what` must finish in `timeout_s` seconds or the process ends."""
        with self._lock:
            self._since = time.monotonic()
            self._deadline, self._what = self._since + timeout_s, what
            self._timeout_s = timeout_s
        try:
            yield
        finally:
            with self._lock:
                self._deadline = None

    def watch(self, probe: Callable[[], str | None]) -> None:
        """From now on, a guarded wait past `probe_after_s` asks `probe` each poll: words
        saying what is lost end the process, None lets the wait go on to its deadline."""
        self._probe = probe

    def _run(self) -> None:
        while True:
            time.sleep(self._poll_s)
            with self._lock:
                now = time.monotonic()
                guarded = self._deadline is not None
                expired = guarded and now > (self._deadline or 0.0)
                message = f"{self._what} did not complete within {self._timeout_s:g} s"
                long = guarded and now - self._since > self._probe_after_s
                what = self._what
            if not expired and long and self._probe is not None:
                # Outside the lock: the probe reads the system's sockets (a few ms).
                lost = self._probe()
                if lost is not None:
                    expired, message = True, f"{what} failed: {lost}"
            if expired:
                try:
                    self._on_expire(message)
                finally:
                    os._exit(EXIT_CODE)
