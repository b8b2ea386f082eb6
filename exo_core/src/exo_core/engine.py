"""The contract between the core and an inference engine plugin.

An `Engine` says which model cards it can serve and creates `Runner`s. A runner serves one shard
of one instance on this node; the worker supervises it and restarts it when it dies.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from exo_core.generation import Chunk
from exo_core.ids import RunnerId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.placement_types import PlacementOption
from exo_core.state import Instance, RunnerStatus, ShardAssignment, Sharding, Task

StatusReporter = Callable[[RunnerStatus, str | None], None]
"""Called by a runner on each status change, with an error message for FAILED."""


class RunnerDied(RuntimeError):
    """The runner stopped serving without being asked to (crash, load failure, lost group)."""


class RunnerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a runner is built from: its instance and shard, the model card, the model's
    files and the node's data directory."""

    runner_id: RunnerId
    instance: Instance
    shard: ShardAssignment
    card: ModelCard
    model_path: str
    data_dir: str


class Runner(abc.ABC):
    """Runs one shard of an instance: loads the model, then serves the tasks it is given
    until stopped, reporting its status and each task's chunks."""

    @abc.abstractmethod
    async def serve(self, report: StatusReporter) -> None:
        """Start, load, warm up, then serve until `stop()`.

        Reports each status through `report`. Returns after `stop()`; raises `RunnerDied` when
        the runner ends any other way. Tasks in flight then end with an `ErrorChunk`."""

    @abc.abstractmethod
    def generate(self, task: Task) -> AsyncIterator[Chunk]:
        """Run one task. The stream ends with a `FinishChunk` or an `ErrorChunk`.

        On ranks other than 0 of a group the stream carries only the final chunk, and
        `task.params` holds no messages, prompt, tools or stop strings: a request's body goes
        to rank 0 only (see `exo_core.bodies`), which shares what the group needs."""

    @abc.abstractmethod
    async def cancel(self, task_id: TaskId) -> None:
        """Stop a task within a few tokens; its stream ends with finish reason `cancelled`."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """End the runner and free everything it holds."""

    @property
    def pid(self) -> int | None:
        """The runner's own process, when it runs in one: telemetry reports its memory."""
        return None


class Engine(abc.ABC):
    """An inference engine: says which model cards it serves and builds a `Runner` for one
    shard of an instance. Return it from the `exo_engines` hook."""

    #: A short name, reported in node telemetry as an available backend (e.g. "mlx").
    name: str = ""
    #: False when this engine's models need no files fetched (weights built in, nothing to
    #: load): the worker then never asks the downloader for its cards, and a runner's
    #: `model_path` is what `prepare_model` returns, else the node's models directory.
    needs_download: bool = True

    @abc.abstractmethod
    def can_serve(self, card: ModelCard) -> bool:
        """Whether this engine can run the model of `card` (its task and format)."""

    async def prepare_model(self, card: ModelCard, models_dir: Path) -> Path | None:
        """Produce the model's files itself when the card's source is the engine's own (e.g.
        weights shipped in a package). Return None to let the downloader fetch them (unless
        `needs_download` is False)."""
        return None

    def sharding_refusal(self, card: ModelCard, sharding: Sharding, ranks: int) -> str | None:
        """Why this engine cannot run `card` split `sharding`-wise over `ranks` nodes, or None
        when it can. Placement offers only what every engine that serves the card can run."""
        return None

    def placement_refusal(self, card: ModelCard, option: PlacementOption) -> str | None:
        """Why this engine cannot run `option` (its sharding, ranks and each rank's layers),
        or None. By default only the sharding and the number of ranks count
        (`sharding_refusal`); an engine whose split depends on the layers each rank gets
        (a rank of a hybrid model that must hold a cache) refuses such splits here."""
        return self.sharding_refusal(card, option.sharding, len(option.shares))

    @abc.abstractmethod
    def create_runner(self, spec: RunnerSpec) -> Runner:
        """A runner for one shard; nothing starts before `serve` is awaited."""
