"""The downloader: fetch a model's files from the hub, resumably and verified.

The network and disk work runs in a thread; the event loop only reports progress (about once a
second) and waits. A download killed at any point resumes from the bytes on disk, in this
process or the next one, because partial files are ours (not huggingface_hub's per-process
temporaries) and are continued with ranged GETs.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import time
from pathlib import Path, PurePosixPath

import anyio
import anyio.to_thread
from loguru import logger

from exo_core.plugin import ModelCard, NodeId, UnsafeModelPath, public_message
from exo_core.plugin.cards import is_safe_model_id, model_id_problem, remove_model_dir
from exo_core.plugin.download import (
    Downloader,
    DownloadFailed,
    DownloadProgress,
    DownloadStatus,
    ProgressReporter,
)
from exo_download_hf.cards import WEIGHT_SUFFIX, HubRef, hub_ref
from exo_download_hf.dirs import BOOKKEEPING, FreeSpace, ModelDirs, disk_free
from exo_download_hf.hub import (
    HubClient,
    HubError,
    HubUnreachable,
    RangeNotSatisfiable,
    RemoteFile,
    RepoSnapshot,
)
from exo_download_hf.lookups import HubLookups
from exo_download_hf.progress import Cancelled, SpeedMeter, Tally
from exo_download_hf.store import FileRecord, Manifest, ModelStore
from exo_download_hf.verify import HashMismatch, verify_file

# What a model needs: weights, configs, tokenizer files, chat templates. Code only when the
# card trusts remote code.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja")
CODE_PATTERNS = ("*.py",)
REPORT_INTERVAL_S = 1.0
# Ranged GETs retried in a row after network errors, each resuming where the last stopped.
MAX_NETWORK_RETRIES = 5


def wanted_files(files: tuple[RemoteFile, ...], trust_remote_code: bool) -> list[RemoteFile]:
    patterns = ALLOW_PATTERNS + (CODE_PATTERNS if trust_remote_code else ())
    out = []
    for f in files:
        parts = PurePosixPath(f.path).parts
        # The hub names the paths; never let one climb out of the model directory, nor land
        # in this plugin's bookkeeping (a repo's `.exo/manifest.json` would pass as ours).
        if f.path.startswith("/") or ".." in parts or not parts or parts[0] == BOOKKEEPING:
            continue
        if any(fnmatch.fnmatch(f.path, p) for p in patterns):
            out.append(f)
    return out


class HfDownloader(Downloader):
    def __init__(
        self,
        dirs: ModelDirs,
        hub: HubClient | None = None,
        *,
        offline: bool = False,
        node_id: NodeId | None = None,
        free_space: FreeSpace = disk_free,
    ) -> None:
        self.dirs = dirs
        self.hub = hub or HubClient()
        self.offline = offline
        # This node's id, which progress reports carry (the worker stamps it on what it
        # relays; reports sent by the plugin itself rely on it).
        self.node_id = node_id or NodeId("")
        self.free_space = free_space
        self._locks: dict[str, anyio.Lock] = {}
        self._active: dict[str, Tally] = {}
        # The API's hub look-ups (search, adding a card), on threads of their own.
        self.lookups = HubLookups()

    # -- finding --------------------------------------------------------------------------------

    def _ref(self, card: ModelCard) -> HubRef:
        ref = hub_ref(card)
        if ref is None:
            raise DownloadFailed(
                f"{card.model_id}: its source '{card.source}' is not a hub repo (hf:<repo>)"
            )
        if (problem := model_id_problem(ref.repo_id)) is not None:
            raise DownloadFailed(f"{card.model_id}: '{ref.repo_id}' is not a hub repo: {problem}")
        return ref

    def find_local(self, card: ModelCard) -> Path | None:
        ref = hub_ref(card)
        return self.find_ref(ref) if ref is not None else None

    def find_ref(self, ref: HubRef) -> Path | None:
        """The complete model: exo's own downloads first, then read-only directories (None
        for a repo id that could lead out of them)."""
        if not is_safe_model_id(ref.repo_id):
            return None
        try:
            writable = self.dirs.writable_candidates(ref.repo_id)
        except UnsafeModelPath as e:
            logger.warning(f"not looking for {ref.repo_id}: {e}")
            return None
        for root in writable:
            if ModelStore(root).is_complete():
                return root
        for root in self.dirs.read_only_candidates(ref.repo_id):
            if ModelStore(root).is_complete() or _looks_complete(root):
                return root
        return None

    # -- fetching -------------------------------------------------------------------------------

    async def ensure(self, card: ModelCard, report: ProgressReporter) -> Path:
        ref = self._ref(card)
        lock = self._locks.setdefault(ref.repo_id, anyio.Lock())
        async with lock:
            tally = Tally()
            found = self.find_local(card)
            if found is not None:
                report(self.completed(card, found))
                return found
            if self.offline:
                searched = ", ".join(str(d) for d in (*self.dirs.writable, *self.dirs.read_only))
                reason = (
                    f"{card.model_id} is not on disk and this node is offline, so it is not "
                    f"downloaded (searched {searched})"
                )
                report(self._progress(card, DownloadStatus.FAILED, tally, error=reason))
                raise DownloadFailed(reason)
            self._active[ref.repo_id] = tally
            try:
                return await self._fetch_reporting(card, ref, tally, report)
            finally:
                self._active.pop(ref.repo_id, None)

    async def _fetch_reporting(
        self, card: ModelCard, ref: HubRef, tally: Tally, report: ProgressReporter
    ) -> Path:
        report(self._progress(card, DownloadStatus.PENDING, tally))
        path: Path | None = None
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._report_loop, card, tally, report)
            try:
                path = await anyio.to_thread.run_sync(
                    self._fetch, card, ref, tally, abandon_on_cancel=True
                )
            except Exception as e:  # handled below, outside the task group
                failure = e
            finally:
                # Stops the thread at its next chunk if we were cancelled.
                tally.cancelled.set()
                tg.cancel_scope.cancel()
        if path is None:
            error = self._failure(card, failure)
            report(self._progress(card, DownloadStatus.FAILED, tally, error=str(error)))
            raise error from failure
        report(self._progress(card, DownloadStatus.COMPLETED, tally, path=str(path)))
        return path

    def _failure(self, card: ModelCard, failure: Exception | None) -> DownloadFailed:
        if isinstance(failure, DownloadFailed):
            return DownloadFailed(str(failure))
        if isinstance(failure, Cancelled):
            why = str(failure) or "the model is being deleted"
            return DownloadFailed(f"{card.model_id}: the download was stopped because {why}")
        logger.opt(exception=failure).error(f"{card.model_id}: download failed")
        detail = public_message(failure) if failure is not None else "it ended without files"
        return DownloadFailed(f"{card.model_id}: download failed: {detail}")

    async def _report_loop(self, card: ModelCard, tally: Tally, report: ProgressReporter) -> None:
        meter = SpeedMeter()
        meter.sample(tally.fetched)
        while True:
            await anyio.sleep(REPORT_INTERVAL_S)
            speed = meter.sample(tally.fetched)
            report(self._progress(card, DownloadStatus.ONGOING, tally, speed=speed))

    def completed(self, card: ModelCard, path: Path) -> DownloadProgress:
        """A report that the model found at `path` is complete (and read-only, when `path` is
        in a read-only directory)."""
        tally = Tally()
        tally.total = tally.base = _dir_size(path)
        return self._progress(card, DownloadStatus.COMPLETED, tally, path=str(path))

    def _progress(
        self,
        card: ModelCard,
        status: DownloadStatus,
        tally: Tally,
        *,
        speed: float = 0.0,
        error: str | None = None,
        path: str | None = None,
    ) -> DownloadProgress:
        remaining = max(0, tally.total - tally.done)
        eta = remaining / speed if speed > 0 and status == DownloadStatus.ONGOING else None
        return DownloadProgress(
            node_id=self.node_id,
            model_id=card.model_id,
            status=status,
            downloaded_bytes=tally.done,
            total_bytes=tally.total,
            speed_bytes_per_s=speed,
            eta_s=eta,
            error=error,
            path=path,
            read_only=path is not None and self.dirs.is_read_only(Path(path)),
        )

    # -- in the thread ----------------------------------------------------------------------------

    def _fetch(self, card: ModelCard, ref: HubRef, tally: Tally) -> Path:
        try:
            snapshot = self.hub.snapshot(ref.repo_id, ref.revision)
        except HubError as e:
            raise DownloadFailed(f"{card.model_id}: {e}") from e
        files = wanted_files(snapshot.files, card.trust_remote_code)
        if not any(f.path.endswith(WEIGHT_SUFFIX) for f in files):
            raise DownloadFailed(f"{card.model_id}: {ref.repo_id} has no {WEIGHT_SUFFIX} weights")
        tally.total = sum(f.size for f in files)
        store = self._choose_store(card, ref, files)
        with store.locked(tally):
            # Another process may have finished it while we waited for the lock.
            if not store.is_complete():
                self._fetch_into(store, ref, snapshot, files, tally)
        tally.base, tally.current = tally.total, 0
        return store.root

    def _choose_store(self, card: ModelCard, ref: HubRef, files: list[RemoteFile]) -> ModelStore:
        """The writable directory to download into: where part of the model already is, if it
        has room for the rest; else the first (default first) with room for what is missing."""
        stores = [ModelStore(root) for root in self.dirs.writable_candidates(ref.repo_id)]
        total = sum(f.size for f in files)
        present = [s.bytes_present(files) for s in stores]
        order = sorted(range(len(stores)), key=lambda i: (present[i] == 0, i))
        free: list[str] = []
        for i in order:
            needed = total - present[i]
            available = self.free_space(stores[i].root.parent)
            if available >= needed:
                return stores[i]
            free.append(f"{stores[i].root.parent} has {available}")
        raise DownloadFailed(
            f"{card.model_id}: not enough free disk space for {total} bytes "
            f"({'; '.join(free)} bytes free). Free some space or add a directory to "
            "EXO_MODELS_DIRS"
        )

    def _fetch_into(
        self,
        store: ModelStore,
        ref: HubRef,
        snapshot: RepoSnapshot,
        files: list[RemoteFile],
        tally: Tally,
    ) -> None:
        old = store.manifest()
        records = {f.path: FileRecord(f.path, f.size, f.expected) for f in files}
        if old is not None:
            for f in files:
                if old.verified(f) and store.has_final(f):
                    records[f.path] = FileRecord(f.path, f.size, f.expected, verified=True)

        def save(complete: bool = False) -> None:
            store.write_manifest(
                Manifest(
                    repo_id=ref.repo_id,
                    revision=ref.revision,
                    commit=snapshot.commit,
                    files=tuple(records.values()),
                    complete=complete,
                )
            )

        save()
        tally.base = sum(r.size for r in records.values() if r.verified)
        for f in files:
            if records[f.path].verified:
                continue
            self._fetch_file(store, ref.repo_id, snapshot.commit, f, tally)
            store.place(f)
            records[f.path] = FileRecord(f.path, f.size, f.expected, verified=True)
            save()
            tally.base += f.size
            tally.current = 0
        save(complete=True)
        store.clear_partials()

    def _fetch_file(
        self, store: ModelStore, repo_id: str, commit: str, f: RemoteFile, tally: Tally
    ) -> None:
        part = store.partial_path(f)
        part.parent.mkdir(parents=True, exist_ok=True)
        failures = 0
        while True:
            tally.check()
            have = part.stat().st_size if part.exists() else 0
            if have > f.size:
                part.unlink()
                have = 0
            tally.current = have
            if have == f.size:
                break
            try:
                if self._append(store, repo_id, commit, f, part, have, tally) > 0:
                    failures = 0
                    continue
                problem = f"{repo_id}/{f.path}: the hub ended the transfer without sending data"
            except RangeNotSatisfiable:
                part.unlink(missing_ok=True)  # the partial does not match the remote file
                continue
            except HubUnreachable as e:
                problem = str(e)
            except HubError as e:
                raise DownloadFailed(f"{repo_id}: {e}") from e
            # A transfer that failed or stalled: resume, a few times, a little later each time.
            failures += 1
            if failures > MAX_NETWORK_RETRIES:
                raise DownloadFailed(f"{problem} (after {MAX_NETWORK_RETRIES} retries)")
            logger.warning(f"{problem}; retrying ({failures}/{MAX_NETWORK_RETRIES})")
            time.sleep(min(8.0, 0.5 * 2**failures))
        try:
            verify_file(part, f.expected, f"{repo_id}/{f.path}")
        except HashMismatch as e:
            part.unlink(missing_ok=True)
            tally.current = 0
            raise DownloadFailed(
                f"{e}; the corrupt download was deleted and will be fetched again on retry"
            ) from e

    def _append(
        self,
        store: ModelStore,
        repo_id: str,
        commit: str,
        f: RemoteFile,
        part: Path,
        have: int,
        tally: Tally,
    ) -> int:
        """Write what the hub sends from byte `have` on; the bytes received."""
        # buffering=0: every chunk reaches the file as it arrives, so a killed process leaves
        # on disk all it received.
        with (
            self.hub.open_range(repo_id, f.path, commit, have) as body,
            part.open("r+b" if part.exists() else "wb", buffering=0) as out,
        ):
            out.seek(body.offset)
            out.truncate()
            written = body.offset
            try:
                for chunk in body.chunks:
                    tally.check()
                    out.write(chunk)
                    written += len(chunk)
                    tally.current = written
                    tally.fetched += len(chunk)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise DownloadFailed(
                        f"{repo_id}/{f.path}: the disk holding {store.root} is full"
                    ) from e
                raise
        return written - body.offset

    def cancel(self, card: ModelCard) -> bool:
        """Stop the model's download in progress; the files fetched so far stay, so a later
        download resumes. True when one was running."""
        ref = hub_ref(card)
        active = self._active.get(ref.repo_id) if ref is not None else None
        if active is None:
            return False
        active.stop_reason = "it was cancelled by request"
        active.cancelled.set()
        return True

    # -- deleting -------------------------------------------------------------------------------

    async def delete(self, card: ModelCard) -> bool:
        ref = hub_ref(card)
        return await self.delete_ref(ref) if ref is not None else False

    async def delete_ref(self, ref: HubRef) -> bool:
        """Delete the model from the writable directories (a download in progress is stopped
        first). Read-only directories are never touched. True when something was deleted."""
        active = self._active.get(ref.repo_id)
        if active is not None:
            active.cancelled.set()
        async with self._locks.setdefault(ref.repo_id, anyio.Lock()):
            return await anyio.to_thread.run_sync(self._delete_now, ref)

    def _delete_now(self, ref: HubRef) -> bool:
        deleted = False
        # Raises UnsafeModelPath for an id that could lead out of the models directories.
        for root in self.dirs.writable_candidates(ref.repo_id):
            # Checked again here: never remove anything inside a read-only directory.
            if not root.exists() or self.dirs.is_read_only(root):
                continue
            # Only a folder this downloader made for this repo: a folder of the same name
            # that something else made (an engine's converted model) is not a download.
            if not _downloaded_here(root, ref.repo_id):
                logger.warning(f"not deleting {root}: it is not exo's download of {ref.repo_id}")
                continue
            # The lock waits out a fetching thread that was just told to stop.
            with ModelStore(root).locked(Tally()):
                remove_model_dir(root.parent, root)
            deleted = True
        return deleted


def _downloaded_here(root: Path, repo_id: str) -> bool:
    """Whether `root` is this downloader's folder for `repo_id`: its manifest names the repo
    (one being started has only the bookkeeping directory yet)."""
    manifest = ModelStore(root).manifest()
    if manifest is None:
        return (root / BOOKKEEPING).is_dir()
    return manifest.repo_id == repo_id


def _looks_complete(root: Path) -> bool:
    """A model placed by hand in a read-only directory: a config and all its weights."""
    if not (root / "config.json").is_file():
        return False
    index = root / "model.safetensors.index.json"
    if index.is_file():
        with contextlib.suppress(OSError, ValueError):
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
            return bool(shards) and all((root / s).is_file() for s in shards)
        return False
    return any(root.glob(f"*{WEIGHT_SUFFIX}"))


def _dir_size(root: Path) -> int:
    return sum(
        p.stat().st_size for p in root.rglob("*") if p.is_file() and BOOKKEEPING not in p.parts
    )
