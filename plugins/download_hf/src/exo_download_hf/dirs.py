"""Where models live on disk: writable directories (with spill-over) and read-only ones.

Layout, in every directory::

    <dir>/<org>--<name>/            the model, as the engine loads it
    <dir>/<org>--<name>/.exo/       this plugin's bookkeeping (the engine never looks there)
        manifest.json               files, sizes, hashes, commit; "complete" once all verified
        partial/<hash>.part         files being fetched, named by their expected hash
        lock                        held (flock) by the one process fetching this model

`EXO_MODELS_DIRS` (colon-separated) adds writable directories after the node's default one;
`EXO_MODELS_READ_ONLY_DIRS` adds directories whose models are used but never written or deleted.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from exo_core.plugin import UnsafeModelPath
from exo_core.plugin.cards import check_model_id, model_path

FreeSpace = Callable[[Path], int]

BOOKKEEPING = ".exo"


def disk_free(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or would, once created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def dir_name(repo_id: str) -> str:
    """`org/name` -> `org--name`: one flat directory per repo, as exo has always named them."""
    return repo_id.replace("/", "--")


def _split(value: str | None) -> list[Path]:
    return [Path(p).expanduser() for p in (value or "").split(os.pathsep) if p.strip()]


def _dedupe(paths: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    out: list[Path] = []
    for p in paths:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _is_within(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _inside(root: Path, name: str) -> Path | None:
    """`root / name`, or None when a symlink there leads out of `root`."""
    try:
        return model_path(root, name)
    except UnsafeModelPath:
        return None


@dataclass(frozen=True)
class ModelDirs:
    """The directories to search, in order: writable ones first (default first), then read-only."""

    writable: tuple[Path, ...]
    read_only: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, default: Path, environ: Mapping[str, str] | None = None) -> ModelDirs:
        env = os.environ if environ is None else environ
        read_only = _dedupe(_split(env.get("EXO_MODELS_READ_ONLY_DIRS")))
        writable = _dedupe([default, *_split(env.get("EXO_MODELS_DIRS"))])
        # A directory named as read-only stays read-only, even when also listed as writable.
        writable = [w for w in writable if not any(_is_within(w, r) for r in read_only)]
        return cls(writable=tuple(writable), read_only=tuple(read_only))

    def is_read_only(self, path: Path) -> bool:
        """Whether `path` lies in a read-only directory (so nothing there may be deleted)."""
        return any(_is_within(path, r) for r in self.read_only)

    def writable_candidates(self, repo_id: str) -> list[Path]:
        """Where this repo's directory is, or would be, in each writable directory.

        Raises `UnsafeModelPath` for a repo id that could lead out of them, and for one whose
        directory is a symlink: exo writes and deletes only its own directories, never through
        a link (`a--b -> other` would take its lock file and deletion to another model)."""
        check_model_id(repo_id)
        found = [model_path(d, dir_name(repo_id)) for d in self.writable]
        for path in found:
            if path.is_symlink():
                raise UnsafeModelPath(f"{path} is a symlink: exo writes only its own directories")
        return found

    def read_only_candidates(self, repo_id: str) -> list[Path]:
        """Read-only directories may hold models laid out by exo (`org--name`) or by hand
        (`org/name`, as `huggingface-cli download --local-dir` users often do)."""
        check_model_id(repo_id)
        names = (dir_name(repo_id), repo_id)
        return [p for d in self.read_only for n in names if (p := _inside(d, n)) is not None]
