"""Waiting in tests for a condition to hold: the one helper, in a blocking and an async form.

`wait_until` blocks (a test's thread, a real process polled over HTTP): a predicate that raises
an HTTP error, a `ValueError` or a `KeyError` (a node not up yet, a field not there yet) counts
as "not yet". `wait_until_async` awaits on the running event loop (a node's own loop, a
transport under test) and lets every error through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx

NOT_YET = (httpx.HTTPError, ValueError, KeyError)


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> None:
    """Until `predicate()` is truthy; `TimeoutError` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except NOT_YET:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02
) -> None:
    """Until `predicate()` is truthy; `TimeoutError` after `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(interval)
