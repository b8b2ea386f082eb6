"""For downloader plugins: the downloader protocol, the progress it reports, and the commands
and events that change the cluster's downloads and custom cards."""

from __future__ import annotations

from exo_core.commands import AddModelCard, DeleteDownload, RemoveModelCard, ReportEvents
from exo_core.downloads import Downloader, DownloadFailed, ProgressReporter
from exo_core.events import DownloadDeleted, DownloadProgressed
from exo_core.state import DownloadProgress, DownloadStatus

__all__ = [
    "AddModelCard",
    "DeleteDownload",
    "DownloadDeleted",
    "DownloadFailed",
    "DownloadProgress",
    "DownloadProgressed",
    "DownloadStatus",
    "Downloader",
    "ProgressReporter",
    "RemoveModelCard",
    "ReportEvents",
]
