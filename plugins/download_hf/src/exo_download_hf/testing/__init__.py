"""Test helpers for downloads: a stand-in for the Hugging Face hub (`hub`) and the tiny model,
card, reporter and engine the download tests share (`tiny`)."""

from exo_download_hf.testing.hub import (
    LFS_SUFFIXES,
    HubStandIn,
    Served,
    StandInRepo,
    git_blob_sha1,
)
from exo_download_hf.testing.tiny import (
    NEEDED,
    TINY,
    TINY_CONFIG,
    WEIGHTS,
    FileCheckingRunner,
    HubEngine,
    HubEnginePlugin,
    Reports,
    TinyCardPlugin,
    card,
    tiny_files,
    tiny_hub,
)

__all__ = [
    "LFS_SUFFIXES",
    "NEEDED",
    "TINY",
    "TINY_CONFIG",
    "WEIGHTS",
    "FileCheckingRunner",
    "HubEngine",
    "HubEnginePlugin",
    "HubStandIn",
    "Reports",
    "Served",
    "StandInRepo",
    "TinyCardPlugin",
    "card",
    "git_blob_sha1",
    "tiny_files",
    "tiny_hub",
]
