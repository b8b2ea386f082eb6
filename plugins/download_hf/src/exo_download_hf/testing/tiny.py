"""What the download tests share besides the hub: a tiny MLX repo (`tiny_files`) and its card,
a progress reporter that keeps every report, an engine that leaves fetching to the
downloader, and `tiny_hub`, a stand-in hub holding the tiny model."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from exo_core.plugin import (
    Chunk,
    FinishChunk,
    FinishReason,
    ModelCard,
    ModelId,
    RunnerStatus,
    Task,
    TaskId,
    hookimpl,
)
from exo_core.plugin.download import DownloadProgress
from exo_core.plugin.engine import Engine, Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_download_hf.testing.hub import HubStandIn

if TYPE_CHECKING:
    import pytest

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


@contextlib.contextmanager
def tiny_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    """A stand-in hub holding the tiny model, which this process's downloads reach through
    `HF_ENDPOINT` (no token, not offline, the default models directories)."""
    with HubStandIn() as stand_in:
        stand_in.add_repo(TINY, tiny_files(), downloads=10)
        monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
        for name in (
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_HUB_OFFLINE",
            "EXO_MODELS_DIRS",
            "EXO_MODELS_READ_ONLY_DIRS",
        ):
            monkeypatch.delenv(name, raising=False)
        yield stand_in
