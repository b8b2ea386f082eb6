"""Runner groups without a cluster, for tests and benchmarks: the runners of one instance on
127.0.0.1, each a real subprocess, driven from synchronous code through a portal thread.

    with RunnerGroup(group_specs(model_dir, sharding="pipeline", world=2)) as group:
        chunks = group.generate(task("t1"))
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

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
    Sharding,
    Task,
    TaskId,
    TextChunk,
)
from exo_core.plugin.engine import RunnerDied, RunnerSpec
from exo_core.plugin.placement import split_layers
from exo_engine_mlx.protocol import RunnerOptions
from exo_engine_mlx.runner import MlxRunner

INSTANCE = InstanceId("group")
MODEL = ModelId("group-model")


class RankOfTwo:
    """Rank `rank` of a 2-rank group, as far as cutting a model for a pipeline stage reads a
    group (its rank and size): a stage built in one process, with no ring."""

    def __init__(self, rank: int) -> None:
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return 2


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (held together, so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def group_specs(
    model_dir: Path,
    *,
    sharding: Sharding,
    world: int,
    ports: Sequence[int] | None = None,
    layer_weights: Sequence[int] | None = None,
) -> list[RunnerSpec]:
    """The runner specs of one instance of the model in `model_dir` over `world` ranks."""
    n_layers = int(json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"])
    ports = list(ports) if ports is not None else free_ports(world)
    ranges = (
        split_layers(n_layers, list(layer_weights or [1] * world))
        if sharding == "pipeline"
        else [(0, n_layers)] * world
    )
    shards = tuple(
        ShardAssignment(
            node_id=NodeId(f"node{rank}"),
            runner_id=RunnerId(f"runner{rank}"),
            rank=rank,
            world_size=world,
            start_layer=start,
            end_layer=end,
            ring_address=f"127.0.0.1:{ports[rank]}" if world > 1 else "",
        )
        for rank, (start, end) in enumerate(ranges)
    )
    card = ModelCard(
        model_id=MODEL, family="llama", n_layers=n_layers, hidden_size=1, storage_size_bytes=1
    )
    instance = Instance(instance_id=INSTANCE, model_id=MODEL, sharding=sharding, shards=shards)
    return [
        RunnerSpec(
            runner_id=s.runner_id,
            instance=instance,
            shard=s,
            card=card,
            model_path=str(model_dir),
            data_dir=str(Path(model_dir).parent),
        )
        for s in shards
    ]


def task(
    task_id: str,
    content: str = "hello world",
    *,
    max_tokens: int = 16,
    temperature: float = 0.0,
    seed: int | None = None,
    sampling: SamplingParams | None = None,
) -> Task:
    params = GenerationParams(
        messages=(ChatMessage(role="user", content=content),),
        max_tokens=max_tokens,
        sampling=sampling or SamplingParams(temperature=temperature, seed=seed),
    )
    return Task(
        task_id=TaskId(task_id),
        instance_id=INSTANCE,
        model_id=MODEL,
        origin_node=NodeId("node0"),
        params=params,
    )


def text_of(chunks: Sequence[Chunk]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextChunk))


@dataclass
class RunnerGroup:
    """Every rank's `MlxRunner`, served on one event loop in a background thread."""

    specs: list[RunnerSpec]
    options: RunnerOptions = field(default_factory=RunnerOptions)
    env: Mapping[str, str] | None = None
    ranks: Sequence[int] | None = None  # start only these ranks (to leave a peer missing)
    # Variables for one rank's environment only (such as another ring token).
    rank_env: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    # Options for one rank only (its node started with other flags, such as `--no-batch`).
    rank_options: Mapping[int, RunnerOptions] = field(default_factory=dict)
    statuses: dict[int, list[tuple[RunnerStatus, str | None]]] = field(default_factory=dict)
    died: dict[int, BaseException] = field(default_factory=dict)
    runners: dict[int, MlxRunner] = field(default_factory=dict)
    _portal: BlockingPortal | None = None
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> RunnerGroup:
        from exo_core.plugin.engine import runner_env

        env = dict(self.env) if self.env is not None else runner_env()
        self._portal = self._exit.enter_context(start_blocking_portal())
        for rank in self.ranks if self.ranks is not None else range(len(self.specs)):
            spec = self.specs[rank]
            self.runners[rank] = MlxRunner(
                spec,
                self.rank_options.get(rank, self.options),
                {**env, **self.rank_env.get(rank, {})},
            )
            self.statuses[rank] = []
            self._portal.start_task_soon(self._serve, rank)
        return self

    async def _serve(self, rank: int) -> None:
        def report(status: RunnerStatus, error: str | None) -> None:
            self.statuses[rank].append((status, error))

        try:
            await self.runners[rank].serve(report)
        except RunnerDied as e:
            self.died[rank] = e

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._exit.close()

    @property
    def portal(self) -> BlockingPortal:
        assert self._portal is not None
        return self._portal

    def status(self, rank: int) -> RunnerStatus | None:
        return self.statuses[rank][-1][0] if self.statuses.get(rank) else None

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout} s; statuses {self.statuses}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 120.0) -> None:
        self.wait(
            lambda: all(self.status(r) == RunnerStatus.READY for r in self.runners),
            timeout,
            "the group was not ready",
        )

    def generate(
        self,
        t: Task,
        *,
        on_chunk: Callable[[int, Chunk], None] | None = None,
        ranks: Sequence[int] | None = None,
    ) -> dict[int, list[Chunk]]:
        """Run `t` on every started rank (or on `ranks`), as every rank's worker would;
        chunks by rank."""
        return self.generate_many([t], on_chunk=on_chunk, ranks=ranks)[t.task_id]

    def generate_many(
        self,
        tasks: Sequence[Task],
        *,
        delays: Mapping[tuple[int, str], float] | None = None,
        on_chunk: Callable[[int, Chunk], None] | None = None,
        ranks: Sequence[int] | None = None,
    ) -> dict[TaskId, dict[int, list[Chunk]]]:
        """Run all `tasks` at once on every rank (or on `ranks`). `delays[(rank, task_id)]`
        holds a submission back, as a slow worker would."""
        results: dict[TaskId, dict[int, list[Chunk]]] = {t.task_id: {} for t in tasks}

        async def one(rank: int, t: Task) -> None:
            await anyio.sleep((delays or {}).get((rank, t.task_id), 0.0))
            chunks: list[Chunk] = []
            results[t.task_id][rank] = chunks
            async for chunk in self.runners[rank].generate(t):
                chunks.append(chunk)
                if on_chunk is not None:
                    on_chunk(rank, chunk)

        async def all_of() -> None:
            async with anyio.create_task_group() as tg:
                for t in tasks:
                    for rank in ranks if ranks is not None else self.runners:
                        tg.start_soon(one, rank, t)

        self.portal.call(all_of)
        return results

    def cancel(self, task_id: str, ranks: Sequence[int] | None = None) -> None:
        for rank in ranks if ranks is not None else list(self.runners):
            self.portal.call(self.runners[rank].cancel, TaskId(task_id))

    def kill(self, rank: int) -> None:
        pid = self.runners[rank].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        async def stop_all() -> None:
            async with anyio.create_task_group() as tg:
                for runner in self.runners.values():
                    tg.start_soon(runner.stop)

        if self._portal is not None:
            self.portal.call(stop_all)


def final(chunks: Sequence[Chunk]) -> FinishChunk | ErrorChunk:
    last = chunks[-1]
    assert isinstance(last, FinishChunk | ErrorChunk), f"the stream ended with {last!r}"
    return last


@contextlib.contextmanager
def running_group(specs: list[RunnerSpec], **kwargs: Any) -> Iterator[RunnerGroup]:
    """A started group whose every rank is READY."""
    with RunnerGroup(specs, **kwargs) as group:
        group.wait_ready()
        yield group
