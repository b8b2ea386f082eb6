"""An asyncio event loop whose clock jumps: sleeps and timeouts take no real time.

When nothing is ready to run, the loop moves its clock to the next timer instead of waiting.
Simulations of many nodes on the in-memory transport then run seconds of cluster time in
milliseconds, and run the same way each time for the same seed.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # real descriptors (the loop's own wake-up pipe) never wait
        if not ready and self.loop is not None:
            # Nothing to do until the next timer: be there now. With no timer at all, a
            # short real wait lets another thread wake us.
            if timeout is None:
                return super().select(0.01)
            self.loop.advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


def virtual_time_options() -> dict[str, Any]:
    """`anyio.run(..., backend_options=virtual_time_options())`."""
    return {"loop_factory": VirtualTimeLoop}
