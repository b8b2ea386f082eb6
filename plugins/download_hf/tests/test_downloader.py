"""The downloader against the stand-in hub, through huggingface_hub unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import anyio
import pytest

from exo_core.plugin.download import DownloadFailed, DownloadStatus
from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.store import ModelStore
from exo_download_hf.testing import NEEDED, TINY, WEIGHTS, HubStandIn, Reports, card, tiny_files

pytestmark = pytest.mark.anyio

WEIGHTS_SHA = hashlib.sha256(tiny_files()["model.safetensors"]).hexdigest()


def downloader(*writable: Path, read_only: tuple[Path, ...] = (), **kw: object) -> HfDownloader:
    return HfDownloader(ModelDirs(writable=writable, read_only=read_only), **kw)  # type: ignore[arg-type]


def weight_fetches(hub: HubStandIn) -> list[int]:
    """Bytes sent for the weights, one entry per GET of their content."""
    return [s.body_bytes for s in hub.content_requests() if s.path == f"/cdn/{WEIGHTS_SHA}"]


async def test_download_from_scratch(hub: HubStandIn, tmp_path: Path) -> None:
    hub.throttle_bytes_per_s = 600_000  # about 2.5 s: several progress reports
    d = downloader(tmp_path / "models")
    reports = Reports()
    path = await d.ensure(card(), reports)

    assert path == tmp_path / "models" / "org--tiny"
    files = tiny_files()
    for name in NEEDED:
        assert (path / name).read_bytes() == files[name]
    assert not (path / "README.md").exists() and not (path / "pytorch_model.bin").exists()
    manifest = ModelStore(path).manifest()
    assert manifest is not None and manifest.complete
    assert manifest.commit == hub.repos[TINY].commit
    assert not (path / ".exo" / "partial").exists()
    assert d.find_local(card()) == path

    total = sum(len(files[n]) for n in NEEDED)
    assert reports[0].status == DownloadStatus.PENDING
    assert reports[-1].status == DownloadStatus.COMPLETED
    assert reports[-1].path == str(path) and reports[-1].downloaded_bytes == total
    assert not any(r.read_only for r in reports)
    ongoing = [r for r in reports if r.status == DownloadStatus.ONGOING]
    assert len(ongoing) >= 2
    # Throttled to about one a second: a 2.5 s download gives a handful, not hundreds.
    assert len(ongoing) <= 5
    done = [r.downloaded_bytes for r in ongoing]
    assert done == sorted(done) and 0 < done[-1] < total
    assert all(r.total_bytes == total for r in ongoing)
    moving = [r for r in ongoing if 0 < r.downloaded_bytes < total]
    assert any(r.speed_bytes_per_s > 100_000 and r.eta_s is not None for r in moving)
    assert weight_fetches(hub) == [WEIGHTS]


async def test_present_model_needs_no_request(hub: HubStandIn, tmp_path: Path) -> None:
    d = downloader(tmp_path)
    await d.ensure(card(), Reports())
    hub.clear()
    reports = Reports()
    assert await d.ensure(card(), reports) == tmp_path / "org--tiny"
    assert hub.served() == []
    assert [(r.status, r.read_only) for r in reports] == [(DownloadStatus.COMPLETED, False)]


async def test_cancelled_download_resumes_with_a_range(hub: HubStandIn, tmp_path: Path) -> None:
    hub.throttle_bytes_per_s = 1_000_000
    d = downloader(tmp_path)
    part = ModelStore(tmp_path / "org--tiny").partial_dir / f"{WEIGHTS_SHA}.part"
    with anyio.move_on_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.ensure, card(), Reports())
            while not part.exists() or part.stat().st_size < 300_000:
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    await anyio.sleep(0.3)  # the abandoned thread stops at its next chunk
    kept = part.stat().st_size
    assert 0 < kept < WEIGHTS
    hub.clear()
    hub.throttle_bytes_per_s = None
    path = await d.ensure(card(), Reports())
    assert (path / "model.safetensors").read_bytes() == tiny_files()["model.safetensors"]
    ranges = [s.range_start for s in hub.content_requests() if s.path.startswith("/cdn/")]
    assert ranges == [kept]
    assert weight_fetches(hub) == [WEIGHTS - kept]


async def test_a_dropped_connection_resumes_in_process(hub: HubStandIn, tmp_path: Path) -> None:
    hub.drop = (TINY, "model.safetensors", 600_000)
    path = await downloader(tmp_path).ensure(card(), Reports())
    assert (path / "model.safetensors").read_bytes() == tiny_files()["model.safetensors"]
    cdn = [s for s in hub.content_requests() if s.path == f"/cdn/{WEIGHTS_SHA}"]
    assert [(s.status, s.range_start, s.body_bytes) for s in cdn] == [
        (200, None, 600_000),
        (206, 600_000, WEIGHTS - 600_000),
    ]


async def test_lfs_hash_mismatch_is_caught(hub: HubStandIn, tmp_path: Path) -> None:
    hub.corrupt.add((TINY, "model.safetensors"))
    d = downloader(tmp_path)
    reports = Reports()
    with pytest.raises(DownloadFailed) as failed:
        await d.ensure(card(), reports)
    message = str(failed.value)
    assert "org/tiny/model.safetensors" in message and "sha256 mismatch" in message
    assert WEIGHTS_SHA in message and "deleted" in message
    root = tmp_path / "org--tiny"
    assert not (root / "model.safetensors").exists()
    assert list((root / ".exo" / "partial").glob("*")) == []
    assert d.find_local(card()) is None
    assert reports[-1].status == DownloadStatus.FAILED and "sha256 mismatch" in (
        reports[-1].error or ""
    )

    # Served correctly again: files verified before (config.json, fetched first) are kept.
    hub.corrupt.clear()
    hub.clear()
    assert await d.ensure(card(), Reports()) == root
    fetched = {s.path.rsplit("/", 1)[-1] for s in hub.content_requests()}
    assert fetched == {WEIGHTS_SHA, "tokenizer.json", "tokenizer_config.json"}


async def test_git_file_hash_mismatch_is_caught(hub: HubStandIn, tmp_path: Path) -> None:
    hub.corrupt.add((TINY, "tokenizer.json"))
    with pytest.raises(DownloadFailed, match=r"org/tiny/tokenizer.json: git-sha1 mismatch"):
        await downloader(tmp_path).ensure(card(), Reports())
    assert not (tmp_path / "org--tiny" / "tokenizer.json").exists()


async def test_spills_over_to_the_next_dir_with_room(hub: HubStandIn, tmp_path: Path) -> None:
    first, second = tmp_path / "small", tmp_path / "big"
    free = {first: 1000, second: 10**12}
    d = downloader(first, second, free_space=lambda p: free[p])
    path = await d.ensure(card(), Reports())
    assert path == second / "org--tiny"
    assert not (first / "org--tiny").exists()
    assert d.find_local(card()) == path


async def test_no_dir_with_room_fails_clearly(hub: HubStandIn, tmp_path: Path) -> None:
    d = downloader(tmp_path / "a", tmp_path / "b", free_space=lambda p: 1000)
    with pytest.raises(DownloadFailed, match="not enough free disk space") as failed:
        await d.ensure(card(), Reports())
    assert "EXO_MODELS_DIRS" in str(failed.value)
    assert weight_fetches(hub) == []


async def test_read_only_dir_is_used_never_deleted(hub: HubStandIn, tmp_path: Path) -> None:
    shared = tmp_path / "nfs"
    await downloader(shared).ensure(card(), Reports())
    hub.clear()
    d = downloader(tmp_path / "own", read_only=(shared,))
    assert d.find_local(card()) == shared / "org--tiny"
    reports = Reports()
    assert await d.ensure(card(), reports) == shared / "org--tiny"
    # Reported as read-only, so that other nodes do not ask for its deletion.
    assert [(r.status, r.read_only) for r in reports] == [(DownloadStatus.COMPLETED, True)]
    assert await d.delete(card()) is False
    assert (shared / "org--tiny" / "model.safetensors").exists()
    assert hub.served() == []


def test_hand_placed_model_in_a_read_only_dir_is_found(tmp_path: Path) -> None:
    root = tmp_path / "ro" / "org" / "tiny"  # the `--local-dir org/name` layout
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    d = downloader(tmp_path / "own", read_only=(tmp_path / "ro",))
    assert d.find_local(card()) is None  # no weights yet
    (root / "model.safetensors").write_bytes(b"x")
    assert d.find_local(card()) == root


async def test_offline_uses_disk_only(hub: HubStandIn, tmp_path: Path) -> None:
    await downloader(tmp_path).ensure(card(), Reports())
    hub.clear()
    offline = downloader(tmp_path, offline=True)
    assert await offline.ensure(card(), Reports()) == tmp_path / "org--tiny"

    reports = Reports()
    with pytest.raises(DownloadFailed, match="offline") as failed:
        await offline.ensure(card("org/absent"), reports)
    assert "org/absent" in str(failed.value) and str(tmp_path) in str(failed.value)
    assert reports[-1].status == DownloadStatus.FAILED
    assert hub.served() == []


async def test_missing_repo_fails_clearly(hub: HubStandIn, tmp_path: Path) -> None:
    with pytest.raises(DownloadFailed, match=r"org/nope: no such repo on http://127\.0\.0\.1"):
        await downloader(tmp_path).ensure(card("org/nope"), Reports())


async def test_repo_without_safetensors_fails_clearly(hub: HubStandIn, tmp_path: Path) -> None:
    hub.add_repo("org/bin-only", {"config.json": b"{}", "pytorch_model.bin": b"x" * 10})
    with pytest.raises(DownloadFailed, match=r"has no \.safetensors weights"):
        await downloader(tmp_path).ensure(card("org/bin-only"), Reports())


async def test_private_repo_uses_hf_token(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("org/private", tiny_files(seed=1), private=True)
    with pytest.raises(DownloadFailed, match="a private repo needs HF_TOKEN"):
        await downloader(tmp_path).ensure(card("org/private"), Reports())
    monkeypatch.setenv("HF_TOKEN", hub.token)
    hub.clear()
    path = await downloader(tmp_path).ensure(card("org/private"), Reports())
    assert (path / "config.json").exists()
    bearer = f"Bearer {hub.token}"
    hub_side = [s for s in hub.served() if not s.path.startswith("/cdn/")]
    assert hub_side and all(s.authorization == bearer for s in hub_side)
    # The token never leaves the hub for the CDN, as with the real hub.
    assert all(s.authorization is None for s in hub.served() if s.path.startswith("/cdn/"))


async def test_revision_in_the_source_is_fetched(hub: HubStandIn, tmp_path: Path) -> None:
    commit = hub.repos[TINY].commit
    path = await downloader(tmp_path).ensure(card(source=f"hf:{TINY}@{commit}"), Reports())
    assert any(f"/revision/{commit}" in s.path for s in hub.served())
    manifest = json.loads((path / ".exo" / "manifest.json").read_text())
    assert manifest["revision"] == commit and manifest["complete"] is True


async def test_stale_partial_longer_than_the_file_is_discarded(
    hub: HubStandIn, tmp_path: Path
) -> None:
    store = ModelStore(tmp_path / "org--tiny")
    store.partial_dir.mkdir(parents=True)
    (store.partial_dir / f"{WEIGHTS_SHA}.part").write_bytes(b"\0" * (WEIGHTS + 10))
    path = await downloader(tmp_path).ensure(card(), Reports())
    assert (path / "model.safetensors").read_bytes() == tiny_files()["model.safetensors"]


async def test_a_server_ignoring_ranges_restarts_the_file(hub: HubStandIn, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "org--tiny")
    store.partial_dir.mkdir(parents=True)
    weights = tiny_files()["model.safetensors"]
    (store.partial_dir / f"{WEIGHTS_SHA}.part").write_bytes(weights[:1000])
    hub.honour_ranges = False
    path = await downloader(tmp_path).ensure(card(), Reports())
    assert (path / "model.safetensors").read_bytes() == weights
    cdn = [s for s in hub.content_requests() if s.path.startswith("/cdn/")]
    assert [(s.status, s.body_bytes) for s in cdn] == [(200, WEIGHTS)]


async def test_delete_stops_a_download_in_progress(hub: HubStandIn, tmp_path: Path) -> None:
    hub.throttle_bytes_per_s = 1_000_000
    d = downloader(tmp_path)
    part = ModelStore(tmp_path / "org--tiny").partial_dir / f"{WEIGHTS_SHA}.part"
    failures: list[DownloadFailed] = []

    async def fetch() -> None:
        try:
            await d.ensure(card(), Reports())
        except DownloadFailed as e:
            failures.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(fetch)
        while not part.exists() or part.stat().st_size < 100_000:
            await anyio.sleep(0.02)
        assert await d.delete(card()) is True
    assert not (tmp_path / "org--tiny").exists()
    assert len(failures) == 1 and "being deleted" in str(failures[0])


async def test_delete_removes_the_model(hub: HubStandIn, tmp_path: Path) -> None:
    d = downloader(tmp_path)
    await d.ensure(card(), Reports())
    assert await d.delete(card()) is True
    assert not (tmp_path / "org--tiny").exists()
    assert d.find_local(card()) is None
    assert await d.delete(card()) is False


def test_a_card_from_elsewhere_is_not_the_hubs(tmp_path: Path) -> None:
    d = downloader(tmp_path)
    assert d.find_local(card(source="embedded:smollm2")) is None
    with pytest.raises(DownloadFailed, match="not a hub repo"):
        anyio.run(d.ensure, card(source="embedded:smollm2"), Reports())


async def test_hub_files_under_the_bookkeeping_folder_are_refused(
    hub: HubStandIn, tmp_path: Path
) -> None:
    """A repo's own `.exo/...` files would land in this plugin's bookkeeping (and be listed as
    verified in the manifest): they are never fetched."""
    forged = json.dumps(
        {"repo_id": "org/forged", "commit": "0" * 40, "files": [], "complete": True}
    )
    files = {**tiny_files(), ".exo/manifest.json": forged.encode(), ".exo/lock": b"mine"}
    hub.add_repo("org/forged", files)
    path = await downloader(tmp_path / "models").ensure(card("org/forged"), Reports())
    manifest = ModelStore(path).manifest()
    assert manifest is not None and manifest.complete
    assert manifest.commit == hub.repos["org/forged"].commit
    listed = sorted(r.path for r in manifest.files)
    assert listed == sorted(NEEDED) and not any(p.startswith(".exo") for p in listed)
    assert (path / ".exo" / "lock").read_bytes() != b"mine"
    served = {s.path for s in hub.served()}
    assert not any(".exo" in p for p in served), served
