"""Fixtures of the download tests: the stand-in hub, reached through HF_ENDPOINT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.testing import HubStandIn, Reports, card, tiny_hub


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    with tiny_hub(monkeypatch) as stand_in:
        yield stand_in


@pytest.fixture
def shared(hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding the tiny model, which nodes started after this (in this process) read
    but never write: EXO_MODELS_READ_ONLY_DIRS names it."""
    shared = tmp_path / "nfs"
    anyio.run(HfDownloader(ModelDirs(writable=(shared,))).ensure, card(), Reports())
    monkeypatch.setenv("EXO_MODELS_READ_ONLY_DIRS", str(shared))
    return shared
