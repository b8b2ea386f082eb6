"""The worker's supervision: restarts with backoff, deletion after repeated failures, tasks
that fail cleanly, and cancellation reaching the runner."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import httpx
import pytest

from exo_core import worker
from exo_core.engine import RunnerDied, StatusReporter
from exo_core.events import InstanceDeleted, RunnerStatusChanged
from exo_core.generation import (
    ChatMessage,
    Chunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    TextChunk,
)
from exo_core.state import RunnerStatus
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin, ScriptedRunner
from exo_core.testing.waiting import wait_until


def test_backoff_doubles_from_two_seconds_up_to_thirty() -> None:
    assert [worker.backoff_delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]


def test_three_failures_delete_the_instance_and_reset_the_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "BACKOFF_BASE_S", 0.05)
    plugin = ScriptedEnginePlugin(fail_load=True)
    with running_node(tmp_path, [plugin]) as node:
        created = httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}).json()
        instance_id = created["instance_id"]
        wait_until(lambda: instance_id not in node.node.state.instances)

        def failures() -> list[int]:
            return [
                e.event.runner.failures
                for e in node.node.replica.log
                if isinstance(e.event, RunnerStatusChanged)
                and e.event.runner.status == RunnerStatus.FAILED
            ]

        # The last failure is reported through the worker's outbox, the delete directly: the
        # report may land just after the deletion.
        wait_until(lambda: len(failures()) >= 3)
        assert failures() == [1, 2, 3]
        events = [e.event for e in node.node.replica.log]
        deleted = [e for e in events if isinstance(e, InstanceDeleted)]
        assert (
            "failed 3 times" in deleted[-1].reason and "scripted load failure" in deleted[-1].reason
        )
        assert len(plugin.engine.runners) == 3
        # A fresh placement starts from zero failures again.
        again = httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}).json()
        wait_until(lambda: again["instance_id"] not in node.node.state.instances)
        assert len(plugin.engine.runners) == 6


class _CrashAfterReady(ScriptedRunner):
    """Comes up READY, then dies: each failure follows a successful start."""

    async def serve(self, report: StatusReporter) -> None:
        report(RunnerStatus.READY, None)
        await anyio.sleep(0.05)
        raise RunnerDied("crashed after starting")


def test_failures_separated_by_a_ready_runner_never_delete_the_instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "BACKOFF_BASE_S", 0.05)
    plugin = ScriptedEnginePlugin()
    engine = plugin.engine
    monkeypatch.setattr(
        engine,
        "create_runner",
        lambda spec: (
            engine.runners.append(_CrashAfterReady(spec, 0.0, False)) or engine.runners[-1]
        ),
    )
    with running_node(tmp_path, [plugin]) as node:
        created = httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}).json()
        wait_until(lambda: len(engine.runners) > worker.MAX_FAILURES + 1)
        assert created["instance_id"] in node.node.state.instances
        failures = [
            e.event.runner.failures
            for e in node.node.replica.log
            if isinstance(e.event, RunnerStatusChanged)
            and e.event.runner.status == RunnerStatus.FAILED
        ]
        assert len(failures) > worker.MAX_FAILURES and set(failures) == {1}


async def _generate(node: RunningNode, text: str, read: int | None = None) -> list[Chunk]:
    params = GenerationParams(messages=(ChatMessage(role="user", content=text),))
    out: list[Chunk] = []
    stream = await node.node.generation.generate("scripted-echo", params)
    async with aclosing(stream) as chunks:
        async for chunk in chunks:
            out.append(chunk)
            if read is not None and len(out) >= read:
                break
    return out


def test_leaving_a_stream_early_cancels_the_task_in_the_runner(tmp_path: Path) -> None:
    plugin = ScriptedEnginePlugin(delay_s=0.2)
    with running_node(tmp_path, [plugin]) as node:
        got = node.call(_generate, node, "one two three four five six seven eight", 2)
        assert len(got) == 2
        wait_until(lambda: not node.node.state.tasks)
        runner = plugin.engine.runners[0]
        wait_until(lambda: got[0].task_id in runner._cancelled)


def test_a_full_generation_through_the_cluster_path(tmp_path: Path) -> None:
    with running_node(tmp_path, [ScriptedEnginePlugin()]) as node:
        got = node.call(_generate, node, "hello there")
        assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "echo: hello there"
        last = got[-1]
        assert isinstance(last, FinishChunk) and last.finish_reason == FinishReason.STOP
        wait_until(lambda: not node.node.state.tasks)  # the task left state when it ended
