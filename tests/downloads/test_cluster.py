"""Two nodes: custom cards are cluster-wide, and a download is deleted on the node that holds it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.ids import ModelId, NodeId
from exo_core.state import DownloadStatus
from exo_core.testing.harness import RunningCluster, RunningNode, running_cluster
from exo_download_hf.dirs import ModelDirs
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.testing import HubStandIn

from .support import TINY, HubEnginePlugin, Reports, card


@pytest.fixture
def cluster(hub: HubStandIn, tmp_path: Path) -> Iterator[RunningCluster]:
    with running_cluster(tmp_path, 2, lambda i: [download_plugin, HubEnginePlugin()]) as c:
        yield c


def model_ids(node: RunningNode) -> set[str]:
    return {m["model_id"] for m in httpx.get(f"{node.url}/models").json()["models"]}


def test_a_custom_model_added_on_one_node_appears_on_the_other(cluster: RunningCluster) -> None:
    first, second = cluster.nodes
    assert httpx.post(f"{first.url}/models/add", json={"model_id": TINY}).status_code == 201
    cluster.wait(lambda: TINY in model_ids(second))
    assert httpx.delete(f"{second.url}/models/custom/{TINY}").status_code == 200
    cluster.wait(lambda: TINY not in model_ids(first))


def _download_on(node: RunningNode) -> Path:
    downloader = node.node.downloader
    assert isinstance(downloader, HfDownloader)
    return node.call(downloader.ensure, card(), Reports())


def test_deleting_on_another_node_goes_through_the_log(cluster: RunningCluster) -> None:
    first, second = cluster.nodes
    path = _download_on(second)
    assert path.is_relative_to(Path(second.node.config.data_dir))
    answer = httpx.delete(f"{first.url}/download/{second.node_id}/{TINY}")
    assert answer.status_code == 202, answer.text
    assert answer.json()["requested"] is True
    cluster.wait(lambda: not path.exists())


def test_another_nodes_read_only_copy_survives_a_delete_request(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "nfs"
    kept = anyio.run(HfDownloader(ModelDirs(writable=(shared,))).ensure, card(), Reports())
    monkeypatch.setenv("EXO_MODELS_READ_ONLY_DIRS", str(shared))
    plugins = lambda i: [download_plugin, HubEnginePlugin()]  # noqa: E731
    with running_cluster(tmp_path / "cluster", 2, plugins) as cluster:
        first, second = cluster.nodes
        assert httpx.post(f"{first.url}/models/add", json={"model_id": TINY}).status_code == 201
        cluster.wait(lambda: TINY in model_ids(second))
        answer = httpx.delete(f"{first.url}/download/{second.node_id}/{TINY}")
        assert answer.status_code == 202, answer.text

        def reported_again() -> bool:
            downloads = first.node.state.downloads.get(NodeId(second.node_id), {})
            p = downloads.get(ModelId(TINY))
            return p is not None and p.status == DownloadStatus.COMPLETED

        # The DownloadDeleted event removed it from state; the node says it still has it.
        cluster.wait(reported_again)
        assert (kept / "model.safetensors").exists()
