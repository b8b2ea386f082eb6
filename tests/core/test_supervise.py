"""No background task's exception ends the node unless the node cannot go on, and then it says
why. Before, telemetry's `OSError: [Errno 24] Too many open files` (psutil reading /proc under a
flood of connections) ended the whole node."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

import exo_core.reporting
from exo_core.supervise import NodeCannotGoOn, essential, keep_running
from exo_core.testing.harness import running_node


@pytest.fixture
def messages() -> Iterator[list[str]]:
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="ERROR")
    yield seen
    logger.remove(sink)


def _out_of_files() -> OSError:
    return OSError(errno.EMFILE, "Too many open files", "/proc/meminfo")


def test_telemetry_out_of_files_is_logged_and_retried_and_the_node_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, messages: list[str]
) -> None:
    real = exo_core.reporting.gather_resources
    failures = [_out_of_files(), _out_of_files()]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(exo_core.reporting, "gather_resources", flaky)
    with running_node(tmp_path, wait_ready=False) as node:
        deadline = time.monotonic() + 30
        while node.node.node_id not in node.node.state.nodes:  # its telemetry arrived
            assert not node.future.done(), node.future.exception()
            assert time.monotonic() < deadline, "telemetry never arrived"
            time.sleep(0.1)
        assert not node.future.done()
    told = [m for m in messages if "telemetry failed" in m]
    assert len(told) == 2, messages
    assert "open-file limit is" in told[0]
    assert "starting it again in 1 s" in told[0] and "starting it again in 2 s" in told[1]
    assert "Traceback" in told[0]


@pytest.mark.anyio
async def test_a_task_is_restarted_with_growing_pauses_until_it_returns(
    messages: list[str],
) -> None:
    runs: list[int] = []

    async def task() -> None:
        runs.append(1)
        if len(runs) < 4:
            raise ValueError(f"failure {len(runs)}")

    await keep_running("a task", task, first_pause_s=0.01, max_pause_s=0.02)
    assert len(runs) == 4
    pauses = [m.split("again in ")[1].split(" s")[0] for m in messages if "a task failed" in m]
    assert len(pauses) == 3


@pytest.mark.anyio
async def test_an_essential_task_stops_the_node_and_says_why(messages: list[str]) -> None:
    async def worker() -> None:
        raise RuntimeError("the disk went away")

    with pytest.raises(NodeCannotGoOn, match="the worker failed: RuntimeError: the disk went away"):
        await essential("the worker", worker)
    assert any("the node cannot go on: the worker failed" in m for m in messages)

    async def refusing() -> None:
        raise NodeCannotGoOn("no way on")

    with pytest.raises(NodeCannotGoOn, match="no way on"):
        await keep_running("a task", refusing)
