"""The native API over real HTTP, on a node with the scripted engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with running_node(tmp_path_factory.mktemp("node"), [ScriptedEnginePlugin()]) as n:
        yield n


def test_node_id_and_health(node: RunningNode) -> None:
    assert httpx.get(f"{node.url}/node_id").json() == {"node_id": node.node_id}
    health = httpx.get(f"{node.url}/healthz").json()
    assert health["status"] == "ok" and health["master"] == node.node_id


def test_state_names_master_and_this_node(node: RunningNode) -> None:
    state = httpx.get(f"{node.url}/state").json()
    assert state["master"]["node_id"] == node.node_id and state["master"]["term"] >= 1
    assert node.node_id in state["nodes"]
    resources = state["nodes"][node.node_id]["resources"]
    assert resources["memory_total"] > 0 and "scripted" in resources["engines"]


def test_state_sub_paths(node: RunningNode) -> None:
    assert httpx.get(f"{node.url}/state/master/node_id").json() == node.node_id
    one = httpx.get(f"{node.url}/state/nodes/{node.node_id}").json()
    assert one["node_id"] == node.node_id
    missing = httpx.get(f"{node.url}/state/nodes/nobody")
    assert missing.status_code == 404
    assert "nobody" in missing.json()["detail"]


def test_models_lists_cards(node: RunningNode) -> None:
    ids = {m["model_id"] for m in httpx.get(f"{node.url}/models").json()["models"]}
    assert {"scripted-echo", "scripted-thinker"} <= ids
    downloaded = httpx.get(f"{node.url}/models", params={"status": "downloaded"}).json()
    assert downloaded["models"] == []


def test_instance_lifecycle(node: RunningNode) -> None:
    created = httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"})
    assert created.status_code == 201, created.text
    instance_id = created.json()["instance_id"]
    got = httpx.get(f"{node.url}/instance/{instance_id}").json()
    assert got["model_id"] == "scripted-echo"
    assert [s["node_id"] for s in got["shards"]] == [node.node_id]
    deleted = httpx.delete(f"{node.url}/instance/{instance_id}")
    assert deleted.status_code == 200
    assert httpx.get(f"{node.url}/instance/{instance_id}").status_code == 404


def test_previews(node: RunningNode) -> None:
    body = httpx.get(f"{node.url}/instance/previews", params={"model_id": "scripted-echo"}).json()
    shardings = {p["sharding"] for p in body["previews"]}
    assert shardings == {"pipeline", "tensor"}
    assert body["previews"][0]["nodes"][0]["end_layer"] == 4
    unknown = httpx.get(f"{node.url}/instance/previews", params={"model_id": "nope"})
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [
        ("GET", "/instance/inst-missing", None, 404, "inst-missing"),
        ("DELETE", "/instance/inst-missing", None, 404, "inst-missing"),
        ("POST", "/instance", {"model_id": "no-such-model"}, 404, "no-such-model"),
        ("POST", "/instance", {"model": "x"}, 422, "model"),
        ("POST", "/instance", {"model_id": 5}, 422, "model_id"),
        (
            "POST",
            "/instance",
            {"model_id": "scripted-echo", "sharding": "diagonal"},
            422,
            "sharding",
        ),
        ("POST", "/instance", {"model_id": "scripted-echo", "min_nodes": 0}, 422, "min_nodes"),
        ("POST", "/instance", {"model_id": "scripted-echo", "min_nodes": 3}, 409, "min_nodes"),
        ("GET", "/events?since=-4", None, 422, "since"),
    ],
)
def test_errors_say_what_was_wrong(
    node: RunningNode, method: str, path: str, body: object, status: int, words: str
) -> None:
    response = httpx.request(method, f"{node.url}{path}", json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["status_code"] == status
    assert words in json.dumps(error)


def test_malformed_json_is_a_clear_error(node: RunningNode) -> None:
    response = httpx.post(
        f"{node.url}/instance", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert response.json()["detail"]


def test_events_stream_from_an_index(node: RunningNode) -> None:
    seen: list[dict[str, object]] = []
    with httpx.stream("GET", f"{node.url}/events", params={"since": 0}, timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        ids: list[int] = []
        for line in r.iter_lines():
            if line.startswith("id:"):
                ids.append(int(line[3:].strip()))
            if line.startswith("data:"):
                seen.append(json.loads(line[5:]))
            if len(seen) >= 3:
                break
    assert ids[:3] == [0, 1, 2]
    assert seen[0]["index"] == 0 and seen[0]["event"]["type"] == "MasterElected"


def test_openapi_schema_is_served(node: RunningNode) -> None:
    schema = httpx.get(f"{node.url}/schema/openapi.json").json()
    assert "/instance" in schema["paths"] and "/state" in schema["paths"]


def test_plugins_endpoint(node: RunningNode) -> None:
    body = httpx.get(f"{node.url}/plugins").json()
    assert body["failed"] == []


def test_state_survives_restart(tmp_path: Path) -> None:
    with running_node(tmp_path, [ScriptedEnginePlugin()]) as first:
        created = httpx.post(f"{first.url}/instance", json={"model_id": "scripted-echo"})
        instance_id = created.json()["instance_id"]
        term = first.node.state.master.term  # type: ignore[union-attr]
    with running_node(tmp_path, [ScriptedEnginePlugin()]) as second:
        assert second.node_id == first.node_id
        assert instance_id in second.node.state.instances
        assert second.node.state.master.term > term  # type: ignore[union-attr]
