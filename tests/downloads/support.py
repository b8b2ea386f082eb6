"""Helpers shared by the download tests: a tiny model, its card, a download-driven engine."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio

from exo_core.engine import Engine, Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_core.generation import Chunk, FinishChunk, FinishReason
from exo_core.hookspecs import hookimpl
from exo_core.ids import ModelId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import DownloadProgress, RunnerStatus, Task

TINY = "org/tiny"
WEIGHTS = 1_500_000

TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "quantization": {"group_size": 64, "bits": 4},
}


def tiny_files(weights: int = WEIGHTS, seed: int = 0) -> dict[str, bytes]:
    """What a small MLX repo holds, plus files the downloader must skip (README, .bin)."""
    rng = random.Random(seed)
    return {
        "config.json": json.dumps(TINY_CONFIG).encode(),
        "tokenizer.json": json.dumps({"model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
        "model.safetensors": rng.randbytes(weights),
        "README.md": b"# tiny\n",
        "pytorch_model.bin": rng.randbytes(1000),
    }


NEEDED = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")


def card(repo: str = TINY, **kw: object) -> ModelCard:
    fields: dict[str, object] = {
        "model_id": ModelId(repo),
        "family": "llama",
        "n_layers": 4,
        "hidden_size": 64,
        "storage_size_bytes": WEIGHTS,
        "source": f"hf:{repo}",
    }
    return ModelCard(**(fields | kw))  # type: ignore[arg-type]


def wait(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Reports(list[DownloadProgress]):
    """A progress reporter that keeps every report."""

    def __call__(self, progress: DownloadProgress) -> None:
        self.append(progress)


# -- an engine that leaves fetching to the downloader --------------------------------------


class FileCheckingRunner(Runner):
    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self._stop = anyio.Event()

    async def serve(self, report: StatusReporter) -> None:
        report(RunnerStatus.LOADING, None)
        missing = [n for n in NEEDED if not (Path(self.spec.model_path) / n).is_file()]
        if missing:
            raise RunnerDied(f"model files missing: {missing}")
        report(RunnerStatus.READY, None)
        await self._stop.wait()

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        yield FinishChunk(task_id=task.task_id, finish_reason=FinishReason.STOP)

    async def cancel(self, task_id: TaskId) -> None:
        pass

    async def stop(self) -> None:
        self._stop.set()


class HubEngine(Engine):
    name = "hub-test"

    def __init__(self) -> None:
        self.runners: list[FileCheckingRunner] = []

    def can_serve(self, card: ModelCard) -> bool:
        return card.source.startswith("hf:")

    def create_runner(self, spec: RunnerSpec) -> Runner:
        runner = FileCheckingRunner(spec)
        self.runners.append(runner)
        return runner


class TinyCardPlugin:
    """Makes the tiny model's card a built-in one, known from the start (so the worker looks
    for it on disk when it starts)."""

    @hookimpl
    def exo_model_cards(self) -> list[ModelCard]:
        return [card()]


class HubEnginePlugin:
    """Its `prepare_model` is the default (None), so the worker calls the downloader."""

    def __init__(self) -> None:
        self.engine = HubEngine()

    @hookimpl
    def exo_engines(self) -> list[Engine]:
        return [self.engine]
