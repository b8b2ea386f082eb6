"""A node that just started serves a request before its first telemetry is in state."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest

from exo_core.reporting import Reporter
from exo_core.testing.harness import running_node
from exo_core.testing.processes import wait_until
from exo_core.testing.scripted_engine import ECHO, ScriptedEnginePlugin


def test_a_request_before_the_first_telemetry_is_placed_on_this_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A loaded machine: the node's first report reaches state after a request has arrived.
    release = threading.Event()
    original: Callable[[Reporter], Coroutine[Any, Any, None]] = Reporter.run

    async def late_telemetry(self: Reporter) -> None:
        await anyio.to_thread.run_sync(release.wait)
        await original(self)

    monkeypatch.setattr(Reporter, "run", late_telemetry)
    with (
        running_node(tmp_path, [ScriptedEnginePlugin()], wait_ready=False) as node,
        ThreadPoolExecutor(1) as pool,
    ):
        try:
            wait_until(lambda: httpx.get(f"{node.url}/healthz", timeout=1).status_code == 200)
            wait_until(lambda: node.node.state.master is not None)
            assert node.node.node_id not in node.node.state.nodes
            body = {"model": ECHO.model_id, "messages": [{"role": "user", "content": "hi"}]}
            answer = pool.submit(
                httpx.post, f"{node.url}/v1/chat/completions", json=body, timeout=90
            )
            # Refused at once without its own telemetry (the bug); else it waits for it.
            with contextlib.suppress(FutureTimeout):
                answer.result(timeout=5)
        finally:
            release.set()
        assert answer.result(timeout=90).status_code == 200, answer.result().text
