"""Two nodes: custom cards are cluster-wide, and a download is deleted on the node that holds it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.plugin import ModelId, NodeId
from exo_core.plugin.download import DownloadDeleted, DownloadProgress, DownloadStatus
from exo_core.testing.harness import RunningCluster, RunningNode, running_cluster
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.testing import TINY, HubEnginePlugin, HubStandIn, Reports, TinyCardPlugin, card


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


def _copy_on(node: RunningNode, holder: RunningNode) -> DownloadProgress | None:
    """What `node` knows of `holder`'s copy of the tiny model."""
    return node.node.state.downloads.get(NodeId(holder.node_id), {}).get(ModelId(TINY))


def _is_read_only(p: DownloadProgress | None) -> bool:
    return p is not None and p.status == DownloadStatus.COMPLETED and p.read_only


def _assert_refused(answer: httpx.Response, shared: Path, holder: RunningNode) -> None:
    assert answer.status_code == 409, answer.text
    detail = answer.json()["detail"]
    assert "read-only" in detail and str(shared) in detail and holder.node_id in detail


async def _deletions(node: RunningNode) -> int:
    return sum(isinstance(e.event, DownloadDeleted) for e in node.node.replica.log)


def test_another_nodes_read_only_copy_survives_a_delete_request(
    shared: Path, tmp_path: Path
) -> None:
    plugins = lambda i: [download_plugin, HubEnginePlugin()]  # noqa: E731
    with running_cluster(tmp_path / "cluster", 2, plugins) as cluster:
        first, second = cluster.nodes
        assert httpx.post(f"{first.url}/models/add", json={"model_id": TINY}).status_code == 201
        cluster.wait(lambda: TINY in model_ids(second))
        # Not reported yet (a custom card added after the worker started): the request goes
        # through the log...
        assert _copy_on(first, second) is None
        answer = httpx.delete(f"{first.url}/download/{second.node_id}/{TINY}")
        assert answer.status_code == 202, answer.text
        # ...the DownloadDeleted event removed it from state, and the node says it still has
        # it, read-only.
        cluster.wait(lambda: _is_read_only(_copy_on(first, second)))
        copy = _copy_on(first, second)
        assert copy is not None and copy.path == str(shared / "org--tiny")
        assert (shared / "org--tiny" / "model.safetensors").exists()
        # Now that it is known to be read-only, the next request is refused at once.
        deletions = cluster.call(_deletions, first)
        _assert_refused(
            httpx.delete(f"{first.url}/download/{second.node_id}/{TINY}"), shared, second
        )
        assert cluster.call(_deletions, first) == deletions


def test_a_read_only_copy_found_at_start_is_refused_at_once(shared: Path, tmp_path: Path) -> None:
    plugins = lambda i: [download_plugin, HubEnginePlugin(), TinyCardPlugin()]  # noqa: E731
    with running_cluster(tmp_path / "cluster", 2, plugins) as cluster:
        first, second = cluster.nodes
        # The worker reports the model it finds on disk; the plugin marks it read-only.
        cluster.wait(lambda: _is_read_only(_copy_on(first, second)))
        _assert_refused(
            httpx.delete(f"{first.url}/download/{second.node_id}/{TINY}"), shared, second
        )
        assert cluster.call(_deletions, first) == 0
        assert _is_read_only(_copy_on(first, second))
        assert (shared / "org--tiny" / "model.safetensors").exists()
