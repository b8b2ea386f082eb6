"""Deadlines for the runner's group work: a collective that never completes ends the process.

A peer that dies closes its sockets and MLX fails the collective at once; a peer that vanishes
(a cable pulled, a frozen machine) would leave us blocked forever. The watchdog thread turns
that into a runner failure with a clear message. It works because `mx.eval` releases the GIL
while it waits. `mx.distributed.init` does not, so forming the group is guarded by
`faulthandler`'s C-level timer instead (see `exo_core.ring.form_group`).
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

    def __init__(self, on_expire: Callable[[str], None], poll_s: float = 0.2) -> None:
        """`on_expire(message)` reports the failure; the process exits right after it."""
        self._on_expire = on_expire
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._what = ""
        self._timeout_s = 0.0
        self._thread = threading.Thread(target=self._run, name="exo-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: str, timeout_s: float) -> Iterator[None]:
        """Within the block, `what` must finish in `timeout_s` seconds or the process ends."""
        with self._lock:
            self._deadline, self._what = time.monotonic() + timeout_s, what
            self._timeout_s = timeout_s
        try:
            yield
        finally:
            with self._lock:
                self._deadline = None

    def _run(self) -> None:
        while True:
            time.sleep(self._poll_s)
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                message = f"{self._what} did not complete within {self._timeout_s:g} s"
            if expired:
                try:
                    self._on_expire(message)
                finally:
                    os._exit(EXIT_CODE)
