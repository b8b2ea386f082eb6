"""One model's directory on disk: its manifest, its partial files and its lock.

A file is moved to its final place only after its hash was verified, and recorded as verified
in the manifest right after; the manifest says `complete` once every file is. So a directory
without a complete manifest is a download in progress (or interrupted), never a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from exo_download_hf.dirs import BOOKKEEPING
from exo_download_hf.hub import RemoteFile
from exo_download_hf.progress import Tally
from exo_download_hf.verify import ExpectedHash


class FileRecord(msgspec.Struct, frozen=True):
    path: str
    size: int
    expected: ExpectedHash
    verified: bool = False


class Manifest(msgspec.Struct, frozen=True):
    repo_id: str
    revision: str
    commit: str
    files: tuple[FileRecord, ...]
    complete: bool = False

    def verified(self, f: RemoteFile) -> bool:
        return any(r.path == f.path and r.expected == f.expected and r.verified for r in self.files)


class ModelStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta = root / BOOKKEEPING
        self.manifest_path = self.meta / "manifest.json"
        self.partial_dir = self.meta / "partial"

    # -- reading --------------------------------------------------------------------------------

    def manifest(self) -> Manifest | None:
        try:
            return msgspec.json.decode(self.manifest_path.read_bytes(), type=Manifest)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None

    def is_complete(self) -> bool:
        """A complete manifest whose files are all there at their sizes (a cheap stat each)."""
        manifest = self.manifest()
        if manifest is None or not manifest.complete:
            return False
        return all(self.has_final(r) for r in manifest.files)

    def has_final(self, f: RemoteFile | FileRecord) -> bool:
        try:
            return (self.root / f.path).stat().st_size == f.size
        except OSError:
            return False

    def partial_path(self, f: RemoteFile) -> Path:
        # Named by the expected hash: a file that changed upstream never resumes a stale partial.
        return self.partial_dir / f"{f.expected.hex}.part"

    def bytes_present(self, files: tuple[RemoteFile, ...] | list[RemoteFile]) -> int:
        """Bytes of `files` already here: verified finals count whole, partials by their size."""
        manifest = self.manifest()
        total = 0
        for f in files:
            if manifest is not None and manifest.verified(f) and self.has_final(f):
                total += f.size
                continue
            with contextlib.suppress(OSError):
                total += min(f.size, self.partial_path(f).stat().st_size)
        return total

    def exists(self) -> bool:
        return self.root.exists()

    # -- writing --------------------------------------------------------------------------------

    def write_manifest(self, manifest: Manifest) -> None:
        self.meta.mkdir(parents=True, exist_ok=True)
        tmp = self.manifest_path.with_suffix(".tmp")
        data = msgspec.json.encode(manifest)
        # Indented, so that a person inspecting the directory can read it.
        tmp.write_text(json.dumps(json.loads(data), indent=2) + "\n")
        os.replace(tmp, self.manifest_path)

    def place(self, f: RemoteFile) -> None:
        """Move a verified partial to its final path."""
        final = self.root / f.path
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.partial_path(f), final)

    def clear_partials(self) -> None:
        if self.partial_dir.exists():
            for p in self.partial_dir.iterdir():
                p.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.partial_dir.rmdir()

    @contextlib.contextmanager
    def locked(self, tally: Tally) -> Iterator[None]:
        """Hold the model's lock (one fetching process per model directory). The kernel drops
        it when the process dies, so a killed download never leaves it stuck."""
        self.meta.mkdir(parents=True, exist_ok=True)
        with (self.meta / "lock").open("a+") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    tally.check()
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
