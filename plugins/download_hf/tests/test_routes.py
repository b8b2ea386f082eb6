"""The plugin's native API routes on a real node, against the stand-in hub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.plugin import ModelId, NodeId
from exo_core.plugin.download import AddModelCard, DeleteDownload, DownloadStatus
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.waiting import wait_until
from exo_download_hf.downloader import HfDownloader
from exo_download_hf.testing import (
    TINY,
    WEIGHTS,
    HubEnginePlugin,
    HubStandIn,
    Reports,
    card,
    tiny_files,
)


@pytest.fixture
def node(hub: HubStandIn, tmp_path: Path) -> Iterator[RunningNode]:
    with running_node(tmp_path / "node", [download_plugin, HubEnginePlugin()]) as n:
        yield n


def models(node: RunningNode) -> dict[str, dict[str, object]]:
    return {m["model_id"]: m for m in httpx.get(f"{node.url}/models").json()["models"]}


def download_locally(node: RunningNode) -> Path:
    downloader = node.node.downloader
    assert isinstance(downloader, HfDownloader)
    return node.call(downloader.ensure, card(), Reports())


def test_add_list_and_remove_a_custom_model(node: RunningNode) -> None:
    added = httpx.post(f"{node.url}/models/add", json={"model_id": TINY})
    assert added.status_code == 201, added.text
    body = added.json()
    expected = {
        "model_id": TINY,
        "family": "llama",
        "n_layers": 4,
        "hidden_size": 64,
        "num_key_value_heads": 2,
        "storage_size_bytes": WEIGHTS,
        "quantization": "4bit",
        "supports_tensor": True,
        "source": f"hf:{TINY}",
        "custom": True,
    }
    assert body.items() >= expected.items()
    # Listed at once: the route waits for its event to apply before answering.
    listed = models(node)[TINY]
    assert listed.items() >= expected.items() and listed["downloads"] == {}

    removed = httpx.delete(f"{node.url}/models/custom/{TINY}")
    assert removed.status_code == 200 and removed.json() == {"model_id": TINY, "deleted": True}
    assert TINY not in models(node)
    again = httpx.delete(f"{node.url}/models/custom/{TINY}")
    assert again.status_code == 404
    assert again.json() == {"status_code": 404, "detail": f"no custom model '{TINY}'"}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model_id": "not a repo!"}, 422, "not a hub repo id"),
        # Non-ASCII letters are \w to Python's regexes; the hub library raised (a 500).
        ({"model_id": "ª"}, 422, "not a hub repo id"),
        ({"model_id": "org/naïve"}, 422, "not a hub repo id"),
        # ASCII, but not a name the hub allows: its library refuses it before any request.
        ({"model_id": "org/a..b"}, 422, "org/a..b"),
        ({"model_id": "-org/name"}, 422, "-org/name"),
        ({"model_id": "org/nope"}, 404, "no such repo"),
        ({"model_id": "mlx-community/Qwen3-0.6B-4bit"}, 409, "built-in"),
        ({"model_id": "org/bad-config"}, 422, "config.json does not give the layers"),
        ({"repo": "org/tiny"}, 422, "unknown field `repo`"),
        ({}, 422, "model_id"),
    ],
)
def test_add_errors(
    node: RunningNode, hub: HubStandIn, body: dict[str, str], status: int, words: str
) -> None:
    hub.add_repo("org/bad-config", {"config.json": b"{}", "model.safetensors": b"x"})
    answer = httpx.post(f"{node.url}/models/add", json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert error["status_code"] == status and words in answer.text


def test_a_custom_model_survives_a_restart(hub: HubStandIn, tmp_path: Path) -> None:
    plugins = [download_plugin, HubEnginePlugin()]
    with running_node(tmp_path / "node", plugins) as first:
        assert httpx.post(f"{first.url}/models/add", json={"model_id": TINY}).status_code == 201
    hub.clear()
    with running_node(tmp_path / "node", plugins) as second:
        assert models(second)[TINY]["custom"] is True
    assert hub.served() == []  # replayed from the event log, not fetched again


def test_search(node: RunningNode, hub: HubStandIn) -> None:
    hub.add_repo("other/tinier", {"config.json": b"{}"}, downloads=1)
    httpx.post(f"{node.url}/models/add", json={"model_id": TINY})
    found = httpx.get(f"{node.url}/models/search", params={"query": "tin", "limit": 5}).json()
    assert found["query"] == "tin"
    assert [(m["model_id"], m["added"]) for m in found["models"]] == [
        (TINY, True),
        ("other/tinier", False),
    ]
    assert found["models"][0]["downloads"] == 10
    one = httpx.get(f"{node.url}/models/search", params={"query": "tin", "limit": 1}).json()
    assert len(one["models"]) == 1
    bad = httpx.get(f"{node.url}/models/search", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["status_code"] == 422


def test_an_offline_node_does_not_call_the_hub(hub: HubStandIn, tmp_path: Path) -> None:
    with running_node(tmp_path / "node", [download_plugin], offline=True) as node:
        added = httpx.post(f"{node.url}/models/add", json={"model_id": TINY})
        assert added.status_code == 409 and "--offline" in added.json()["detail"]
        assert httpx.get(f"{node.url}/models/search").status_code == 409
    assert hub.served() == []


def test_the_downloader_knows_its_node(node: RunningNode) -> None:
    """Reports the plugin sends itself (not through the worker) must name the node."""
    downloader = node.node.downloader
    assert isinstance(downloader, HfDownloader)
    assert downloader.node_id == node.node_id
    reports = Reports()
    node.call(downloader.ensure, card(), reports)
    assert reports and all(r.node_id == node.node_id for r in reports)


def test_delete_a_local_download(node: RunningNode) -> None:
    path = download_locally(node)
    url = f"{node.url}/download/{node.node_id}/{TINY}"
    deleted = httpx.delete(url)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"node_id": node.node_id, "model_id": TINY, "deleted": True}
    assert not path.exists()
    again = httpx.delete(url)
    assert again.status_code == 404 and "not downloaded" in again.json()["detail"]


def test_delete_refused_in_a_read_only_dir(shared: Path, tmp_path: Path) -> None:
    kept = shared / "org--tiny"
    with running_node(tmp_path / "node", [download_plugin]) as node:
        refused = httpx.delete(f"{node.url}/download/{node.node_id}/{TINY}")
        assert refused.status_code == 409
        detail = refused.json()["detail"]
        assert "read-only" in detail and str(shared) in detail and node.node_id in detail
        assert (kept / "model.safetensors").exists()
        assert node.node.downloader is not None
        assert node.node.downloader.find_local(card()) == kept


def test_delete_on_an_unknown_node(node: RunningNode) -> None:
    answer = httpx.delete(f"{node.url}/download/node-nobody/{TINY}")
    assert answer.status_code == 404 and "node-nobody" in answer.json()["detail"]


def test_a_delete_request_in_the_log_deletes_here(node: RunningNode) -> None:
    """What another node's DELETE /download/<this node>/... leads to on this node."""
    path = download_locally(node)
    request = DeleteDownload(node_id=NodeId(node.node_id), model_id=ModelId(TINY))
    node.call(node.node.send_command, request)
    wait_until(lambda: not path.exists())


def test_a_delete_request_for_a_read_only_model_is_answered_by_a_report(
    shared: Path, tmp_path: Path
) -> None:
    kept = shared / "org--tiny"
    with running_node(tmp_path / "node", [download_plugin]) as node:
        me = NodeId(node.node_id)
        node.call(node.node.send_command, AddModelCard(card=card()))
        request = DeleteDownload(node_id=me, model_id=ModelId(TINY))
        node.call(node.node.send_command, request)

        def reported() -> bool:
            p = node.node.state.downloads.get(me, {}).get(ModelId(TINY))
            return p is not None and p.status == DownloadStatus.COMPLETED

        wait_until(reported)
        progress = node.node.state.downloads[me][ModelId(TINY)]
        assert progress.path == str(kept) and progress.read_only is True
        assert (kept / "model.safetensors").exists()


def test_a_custom_card_records_the_parsers_its_tokenizer_shows(
    node: RunningNode, hub: HubStandIn
) -> None:
    """A Qwen3-style repo (hermes tool calls, <think> with a switch) and a MiniMax M2 one whose
    template is a chat_template.jinja file: /models/add records what mlx-lm's detection finds,
    /models shows it."""
    added = {"1000": {"content": "<think>"}, "1001": {"content": "</think>"}}
    qwen = {
        "chat_template": "{% for tool_call in calls %}<tool_call>{{ tool_call.name }}{% endfor %}"
        "{% if enable_thinking %}{% endif %}",
        "added_tokens_decoder": added,
    }
    files = {**tiny_files(), "tokenizer_config.json": json.dumps(qwen).encode()}
    hub.add_repo("org/qwen-style", files)
    minimax = {
        **tiny_files(),
        "tokenizer_config.json": json.dumps({"added_tokens_decoder": added}).encode(),
    }
    hub.add_repo("org/m2-style", {**minimax, "chat_template.jinja": b"<minimax:tool_call>"})
    for repo, tool, capabilities in [
        ("org/qwen-style", "hermes", ["text", "thinking", "thinking_toggle", "tools"]),
        ("org/m2-style", "minimax_m2", ["text", "thinking", "tools"]),
    ]:
        answer = httpx.post(f"{node.url}/models/add", json={"model_id": repo})
        assert answer.status_code == 201, answer.text
        shown = models(node)[repo]
        for body in (answer.json(), shown):
            assert (body["tool_parser"], body["reasoning_parser"]) == (tool, "think")
            assert body["capabilities"] == capabilities
    # The tiny repo's template names no tools and no thinking: a text-only card.
    plain = httpx.post(f"{node.url}/models/add", json={"model_id": TINY}).json()
    assert plain["capabilities"] == ["text"] and plain["tool_parser"] is None


# -- exo's download routes: POST /download/start, POST /download/cancel -----------------------

# exo's answers (api/types/api.py: StartDownloadResponse, CancelDownloadResponse are frozen
# models, written with camelCase keys): the field names and types a client reads.
EXO_DOWNLOAD_RESPONSE = {"commandId": str}


def exo_shard(model_id: str) -> dict[str, object]:
    """exo's shard metadata as its dashboard sends it: a tagged, camelCase model."""
    card = {"modelId": model_id, "storageSize": {"inBytes": WEIGHTS}, "nLayers": 4}
    fields = {"modelCard": card, "deviceRank": 0, "worldSize": 1, "startLayer": 0}
    return {"PipelineShardMetadata": {**fields, "endLayer": 4, "nLayers": 4}}


def progress_of(node: RunningNode) -> object:
    return node.node.state.downloads.get(NodeId(node.node_id), {}).get(ModelId(TINY))


def test_exo_download_start_and_cancel(node: RunningNode, hub: HubStandIn) -> None:
    node.call(node.node.run_command, AddModelCard(card=card()))
    hub.throttle_bytes_per_s = 300_000  # ~5 s for the weights: time to cancel midway
    body = {"targetNodeId": node.node_id, "shardMetadata": exo_shard(TINY)}
    started = httpx.post(f"{node.url}/download/start", json=body)
    assert started.status_code == 200, started.text
    answer = started.json()
    assert {k: type(v) for k, v in answer.items()} == EXO_DOWNLOAD_RESPONSE
    wait_until(lambda: getattr(progress_of(node), "downloaded_bytes", 0) > 0)
    cancel = {"target_node_id": node.node_id, "model_id": TINY}  # snake_case works too
    cancelled = httpx.post(f"{node.url}/download/cancel", json=cancel)
    assert cancelled.status_code == 200, cancelled.text
    assert {k: type(v) for k, v in cancelled.json().items()} == EXO_DOWNLOAD_RESPONSE

    def failed() -> bool:
        p = progress_of(node)
        return p is not None and getattr(p, "status", None) == DownloadStatus.FAILED

    wait_until(failed)
    assert "cancelled by request" in str(getattr(progress_of(node), "error", ""))
    again = httpx.post(f"{node.url}/download/cancel", json=cancel)
    assert again.status_code == 404 and "no download" in again.json()["detail"]
    # Started again, it resumes and completes.
    hub.throttle_bytes_per_s = None
    assert httpx.post(f"{node.url}/download/start", json=body).status_code == 200

    def completed() -> bool:
        return getattr(progress_of(node), "status", None) == DownloadStatus.COMPLETED

    wait_until(completed)


@pytest.mark.parametrize(
    ("route", "body", "status", "words"),
    [
        ("start", [1], 422, "JSON object"),
        ("start", {"target_node_id": "me", "shard_metadata": {}, "x": 1}, 422, "unknown field"),
        ("start", {"target_node_id": "me"}, 422, "shard_metadata is required"),
        ("start", {"target_node_id": "me", "shard_metadata": {"a": 1}}, 422, "model_card"),
        ("start", {"target_node_id": 7, "shard_metadata": {}}, 422, "target_node_id"),
        ("start", {"target_node_id": "node-other", "shard_metadata": {}}, 409, "own API"),
        ("cancel", {"target_node_id": "me", "model_id": "org/nope"}, 404, "unknown model"),
        ("cancel", {"targetNodeId": "me"}, 422, "model_id is required"),
    ],
)
def test_exo_download_routes_refuse_bad_bodies(
    node: RunningNode, route: str, body: object, status: int, words: str
) -> None:
    if isinstance(body, dict):
        for key in ("target_node_id", "targetNodeId"):
            if body.get(key) == "me":
                body[key] = node.node_id
    answer = httpx.post(f"{node.url}/download/{route}", json=body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["detail"]
    unknown = {"targetNodeId": node.node_id, "shardMetadata": exo_shard("org/nope")}
    assert httpx.post(f"{node.url}/download/start", json=unknown).status_code == 404
