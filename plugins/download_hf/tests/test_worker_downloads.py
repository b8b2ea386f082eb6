"""End to end on a node: placing an instance makes the worker download the model first."""

from __future__ import annotations

from pathlib import Path

import httpx

import exo_download_hf.plugin as download_plugin
from exo_core.plugin import ModelId, NodeId, RunnerStatus
from exo_core.plugin.download import AddModelCard, DownloadStatus
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.waiting import wait_until
from exo_download_hf.testing import TINY, HubEnginePlugin, HubStandIn, card


def runner_statuses(node: RunningNode) -> list[RunnerStatus]:
    return [r.status for r in node.node.state.runners.values()]


def test_placing_an_instance_downloads_the_model(hub: HubStandIn, tmp_path: Path) -> None:
    with running_node(tmp_path / "node", [download_plugin, HubEnginePlugin()]) as node:
        assert httpx.post(f"{node.url}/models/add", json={"model_id": TINY}).status_code == 201
        placed = httpx.post(f"{node.url}/instance", json={"model_id": TINY})
        assert placed.status_code == 201, placed.text
        wait_until(lambda: RunnerStatus.READY in runner_statuses(node))

        progress = node.node.state.downloads[NodeId(node.node_id)][ModelId(TINY)]
        assert progress.status == DownloadStatus.COMPLETED
        assert progress.node_id == node.node_id
        assert progress.read_only is False
        model_dir = tmp_path / "node" / "models" / "org--tiny"
        assert progress.path == str(model_dir)
        assert (model_dir / "model.safetensors").is_file()
        downloaded = httpx.get(f"{node.url}/models", params={"status": "downloaded"}).json()
        assert [m["model_id"] for m in downloaded["models"]] == [TINY]


def test_offline_node_fails_the_runner_not_the_node(hub: HubStandIn, tmp_path: Path) -> None:
    plugins = [download_plugin, HubEnginePlugin()]
    with running_node(tmp_path / "node", plugins, offline=True) as node:
        # As `/models/add` would add it (offline, the route itself refuses): a custom card.
        node.call(node.node.send_command, AddModelCard(card=card(custom=True)))
        placed = httpx.post(f"{node.url}/instance", json={"model_id": TINY})
        assert placed.status_code == 201, placed.text
        wait_until(lambda: RunnerStatus.FAILED in runner_statuses(node))
        failed = next(r for r in node.node.state.runners.values())
        assert failed.error is not None
        assert "offline" in failed.error and "not on disk" in failed.error
        progress = node.node.state.downloads[NodeId(node.node_id)][ModelId(TINY)]
        assert progress.status == DownloadStatus.FAILED and "offline" in (progress.error or "")
        assert httpx.get(f"{node.url}/healthz").json()["status"] == "ok"
    assert hub.served() == []


def test_no_downloads_fails_the_runner_and_fetches_nothing(hub: HubStandIn, tmp_path: Path) -> None:
    plugins = [download_plugin, HubEnginePlugin()]
    with running_node(tmp_path / "node", plugins, downloads=False) as node:
        # A custom card: placement may put it on any node with an engine.
        node.call(node.node.send_command, AddModelCard(card=card(custom=True)))
        placed = httpx.post(f"{node.url}/instance", json={"model_id": TINY})
        assert placed.status_code == 201, placed.text
        wait_until(lambda: RunnerStatus.FAILED in runner_statuses(node))
        failed = next(r for r in node.node.state.runners.values())
        assert failed.error is not None and "--no-downloads" in failed.error
        assert httpx.get(f"{node.url}/healthz").json()["status"] == "ok"
    assert hub.served() == []


def test_no_downloads_still_runs_a_model_on_disk(hub: HubStandIn, tmp_path: Path) -> None:
    plugins = [download_plugin, HubEnginePlugin()]
    with running_node(tmp_path / "node", plugins) as node:
        node.call(node.node.send_command, AddModelCard(card=card(custom=True)))
        placed = httpx.post(f"{node.url}/instance", json={"model_id": TINY})
        wait_until(lambda: RunnerStatus.READY in runner_statuses(node))
        httpx.delete(f"{node.url}/instance/{placed.json()['instance_id']}")
    fetched = len(hub.served())
    with running_node(tmp_path / "node", plugins, downloads=False) as node:
        placed = httpx.post(f"{node.url}/instance", json={"model_id": TINY})
        assert placed.status_code == 201, placed.text
        wait_until(lambda: RunnerStatus.READY in runner_statuses(node))
    assert len(hub.served()) == fetched
