"""The contract between the core and a downloader plugin."""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path

from exo_core.model_cards import ModelCard
from exo_core.state import DownloadProgress, DownloadStatus

ProgressReporter = Callable[[DownloadProgress], None]
"""Called by a downloader with each `DownloadProgress` it has to report."""


class DownloadFailed(RuntimeError):
    """The model could not be fetched; the message says why (offline, missing, hash...)."""


class Downloader(abc.ABC):
    """Finds and fetches a model's files. Return one from the `exo_downloader` hook."""

    @abc.abstractmethod
    def find_local(self, card: ModelCard) -> Path | None:
        """The directory holding the complete model, if any is on disk."""

    @abc.abstractmethod
    async def ensure(self, card: ModelCard, report: ProgressReporter) -> Path:
        """Download what is missing (resuming partial files) and return the model directory.

        Reports progress about once a second. Raises `DownloadFailed`."""

    @abc.abstractmethod
    async def delete(self, card: ModelCard) -> bool:
        """Delete the model's files; False when they are in a read-only directory or absent."""


def needs_fetching(card: ModelCard, here: DownloadProgress | None) -> bool:
    """Whether running `card` on a node means downloading it there: a hub model (`hf:`) that
    the node has not reported complete (`here`: its download entry, if any). Embedded and
    local models never need it."""
    complete = here is not None and here.status == DownloadStatus.COMPLETED
    return card.source.startswith("hf:") and not complete
