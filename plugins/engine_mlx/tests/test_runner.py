"""The runner subprocess: statuses, generation, death and shutdown, for real."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    ErrorChunk,
    FinishChunk,
    GenerationParams,
    Instance,
    InstanceId,
    ModelCard,
    ModelId,
    NodeId,
    RunnerId,
    RunnerStatus,
    SamplingParams,
    ShardAssignment,
    Task,
    TaskId,
    TextChunk,
)
from exo_core.plugin.engine import RunnerDied, RunnerSpec
from exo_engine_mlx.protocol import RunnerOptions
from exo_engine_mlx.runner import MlxRunner
from exo_engine_mlx.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def spec_for(model_dir: Path) -> RunnerSpec:
    shard = ShardAssignment(
        node_id=NodeId("n"),
        runner_id=RunnerId("r"),
        rank=0,
        world_size=1,
        start_layer=0,
        end_layer=2,
    )
    card = ModelCard(
        model_id=ModelId("tiny"), family="llama", n_layers=2, hidden_size=64, storage_size_bytes=1
    )
    instance = Instance(
        instance_id=InstanceId("i"), model_id=ModelId("tiny"), sharding="pipeline", shards=(shard,)
    )
    return RunnerSpec(
        runner_id=RunnerId("r"), instance=instance, shard=shard, card=card,
        model_path=str(model_dir), data_dir=str(model_dir.parent),
    )  # fmt: skip


def task(task_id: str, max_tokens: int = 8) -> Task:
    params = GenerationParams(
        messages=(ChatMessage(role="user", content="hello world"),),
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0),
    )
    return Task(
        task_id=TaskId(task_id), instance_id=InstanceId("i"), model_id=ModelId("tiny"),
        origin_node=NodeId("n"), params=params,
    )  # fmt: skip


async def collect(runner: MlxRunner, t: Task) -> list[Chunk]:
    return [c async for c in runner.generate(t)]


@pytest.mark.anyio
async def test_statuses_generation_and_clean_stop(model_dir: Path) -> None:
    runner = MlxRunner(spec_for(model_dir), RunnerOptions(), dict(os.environ))
    statuses: list[RunnerStatus] = []
    pid: int | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.serve, lambda s, e: statuses.append(s))
        with anyio.fail_after(60):
            while RunnerStatus.READY not in statuses:
                await anyio.sleep(0.05)
        assert statuses == [RunnerStatus.LOADING, RunnerStatus.WARMING_UP, RunnerStatus.READY]
        chunks = await collect(runner, task("t1"))
        assert isinstance(chunks[-1], FinishChunk)
        assert "".join(c.text for c in chunks if isinstance(c, TextChunk))
        pid = runner.pid
        await runner.stop()
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.anyio
async def test_a_killed_runner_fails_its_tasks_and_reports_death(model_dir: Path) -> None:
    runner = MlxRunner(spec_for(model_dir), RunnerOptions(), dict(os.environ))
    ready = anyio.Event()
    died: list[BaseException] = []
    chunks: list[Chunk] = []

    async def serve() -> None:
        try:
            await runner.serve(lambda s, e: ready.set() if s == RunnerStatus.READY else None)
        except RunnerDied as e:
            died.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(60):
            await ready.wait()
        with anyio.fail_after(30):
            async for chunk in runner.generate(task("t2", max_tokens=100_000)):
                chunks.append(chunk)
                if len(chunks) == 2:
                    assert runner.pid is not None
                    os.kill(runner.pid, signal.SIGKILL)
    assert isinstance(chunks[-1], ErrorChunk), "the caller gets an error, not a hang"
    assert died and "exit" in str(died[0])
