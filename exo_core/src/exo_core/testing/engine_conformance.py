"""The engine conformance suite: every engine must pass it.

Use it from a test module by importing the tests and providing one fixture, `engine_case`, that
returns an `EngineCase` (the engine, a card it serves, where the model's files are, a prompt)::

    from exo_core.testing.engine_conformance import *  # noqa: F403

    @pytest.fixture
    def engine_case(tmp_path):
        return EngineCase(engine=MyEngine(), card=MY_CARD, model_path=tmp_path)

It checks, on a real runner: statuses up to READY, a generation that streams text and ends with
one finish chunk carrying usage, `max_tokens`, cancellation mid-stream, `stop()` ending `serve`,
and that a task sent to a stopped runner ends with an error instead of hanging.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from exo_core.engine import Engine, Runner, RunnerSpec
from exo_core.generation import (
    ChatMessage,
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    SamplingParams,
    TextChunk,
)
from exo_core.ids import InstanceId, NodeId, RunnerId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import Instance, RunnerStatus, ShardAssignment, Task

__all__ = ["EngineCase", "test_a_runner_through_its_life"]

# Generous: an engine may load weights in a subprocess on a loaded machine.
READY_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 60.0


@dataclass
class EngineCase:
    engine: Engine
    card: ModelCard
    model_path: Path
    prompt: str = "count from one to twenty: one two three four five"


def spec(case: EngineCase) -> RunnerSpec:
    shard = ShardAssignment(
        node_id=NodeId("node"), runner_id=RunnerId("runner"), rank=0, world_size=1,
        start_layer=0, end_layer=case.card.n_layers,
    )  # fmt: skip
    instance = Instance(
        instance_id=InstanceId("instance"), model_id=case.card.model_id, sharding="pipeline",
        shards=(shard,),
    )  # fmt: skip
    return RunnerSpec(
        runner_id=shard.runner_id, instance=instance, shard=shard, card=case.card,
        model_path=str(case.model_path), data_dir=str(case.model_path),
    )  # fmt: skip


def task(case: EngineCase, task_id: str, max_tokens: int) -> Task:
    params = GenerationParams(
        messages=(ChatMessage(role="user", content=case.prompt),),
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0),
    )
    return Task(
        task_id=TaskId(task_id), instance_id=InstanceId("instance"), model_id=case.card.model_id,
        origin_node=NodeId("node"), params=params,
    )  # fmt: skip


@dataclass
class Serving:
    runner: Runner
    statuses: list[RunnerStatus]
    ended: anyio.Event


@asynccontextmanager
async def serving(case: EngineCase) -> AsyncIterator[Serving]:
    """A runner of the case's engine, READY; stopped (and `serve` awaited) on exit."""
    assert case.engine.can_serve(case.card), "the engine must serve the case's card"
    runner = case.engine.create_runner(spec(case))
    statuses: list[RunnerStatus] = []
    ended = anyio.Event()

    async def serve() -> None:
        try:
            await runner.serve(lambda status, error: statuses.append(status))
        finally:
            ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(READY_TIMEOUT_S):
            while RunnerStatus.READY not in statuses:
                assert not ended.is_set(), f"serve ended before READY: {statuses}"
                await anyio.sleep(0.02)
        try:
            yield Serving(runner, statuses, ended)
        finally:
            with anyio.fail_after(STEP_TIMEOUT_S):
                await runner.stop()
                await ended.wait()


async def collect(runner: Runner, t: Task) -> list[Chunk]:
    with anyio.fail_after(STEP_TIMEOUT_S):
        return [chunk async for chunk in runner.generate(t)]


def finish_of(chunks: list[Chunk]) -> FinishChunk:
    finals = [c for c in chunks if isinstance(c, FinishChunk | ErrorChunk)]
    assert len(finals) == 1 and chunks[-1] is finals[0], f"one final chunk, last: {chunks}"
    assert isinstance(finals[0], FinishChunk), f"the generation failed: {finals[0]}"
    return finals[0]


def check_generation(chunks: list[Chunk], max_tokens: int) -> FinishChunk:
    """Text streamed, one finish last, with usage, within `max_tokens`."""
    finish = finish_of(chunks)
    texts = [c for c in chunks if isinstance(c, TextChunk)]
    assert texts and "".join(c.text for c in texts), "no text"
    assert finish.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert finish.usage.prompt_tokens > 0
    assert 1 <= finish.usage.completion_tokens <= max_tokens
    if finish.usage.completion_tokens == max_tokens:
        assert finish.finish_reason == FinishReason.LENGTH
    return finish


async def generate_then_cancel(runner: Runner, t: Task) -> list[Chunk]:
    chunks: list[Chunk] = []
    with anyio.fail_after(STEP_TIMEOUT_S):
        async for chunk in runner.generate(t):
            chunks.append(chunk)
            if len(chunks) == 1:
                await runner.cancel(t.task_id)
    return chunks


@pytest.mark.anyio
async def test_a_runner_through_its_life(engine_case: EngineCase) -> None:
    """One runner (engines may take seconds to start one): READY, generations, max_tokens,
    cancel mid-stream, stop, then a task after stop."""
    async with serving(engine_case) as s:
        assert s.statuses[-1] == RunnerStatus.READY and RunnerStatus.FAILED not in s.statuses
        chunks = await collect(s.runner, task(engine_case, "t-stream", max_tokens=8))
        assert all(c.task_id == "t-stream" for c in chunks)
        check_generation(chunks, max_tokens=8)
        check_generation(await collect(s.runner, task(engine_case, "t-max", 2)), max_tokens=2)
        cancelled = await generate_then_cancel(s.runner, task(engine_case, "t-cancel", 400))
        finish = finish_of(cancelled)
        # A model may end on its own first; it must not run on to the limit.
        assert finish.finish_reason in (FinishReason.CANCELLED, FinishReason.STOP), finish
        assert finish.usage.completion_tokens < 400
        runner = s.runner
    assert s.ended.is_set(), "serve() must return after stop()"
    after: list[Chunk] = []
    refused: Exception | None = None
    try:
        after = await collect(runner, task(engine_case, "t-after-stop", max_tokens=4))
    except Exception as e:  # raising is a fine way to refuse
        refused = e
    assert refused is not None or isinstance(after[-1], ErrorChunk), after
