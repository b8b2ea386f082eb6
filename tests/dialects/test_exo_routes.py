"""exo's own routes on a real node (scripted engine, the built-in catalogue): their answers
have exo's field names and types, as exo's pydantic types (src/exo/api/types/api.py,
shared/models/model_cards.py, shared/types/worker/*.py) give them, and bad input is a 4xx.

The schemas below are written from exo's source: a dict of field -> type (a tuple: any
of those; a dict: a nested object; `[t]`: a list of t). exo writes its frozen models (card,
instance, shard, memory) with camelCase keys, its plain ones with snake_case keys.
"""

from __future__ import annotations

import base64
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import exo_download_hf.plugin as download_plugin
from exo_api_openai import images
from exo_api_openai.bench import StepClock
from exo_core.generation import FinishChunk, FinishReason, ImageChunk, ProgressChunk, Usage
from exo_core.ids import TaskId
from exo_core.plugin import InvalidRequest
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

from .support import DIALECTS

NONE = type(None)
MEMORY = {"inBytes": int}
# ModelCard (shared/models/model_cards.py), the fields every card has.
EXO_CARD = {
    "modelId": str,
    "storageSize": MEMORY,
    "nLayers": int,
    "hiddenSize": int,
    "supportsTensor": bool,
    "numKeyValueHeads": (int, NONE),
    "tasks": [str],
    "components": (list, NONE),
    "family": str,
    "quantization": str,
    "baseModel": str,
    "capabilities": [str],
    "backends": [str],
    "reasoningDialect": str,
    "contextLength": int,
    "usesCfg": bool,
    "trustRemoteCode": bool,
    "isCustom": bool,
    "vision": (dict, NONE),
}
# PipelineShardMetadata / TensorShardMetadata (shared/types/worker/shards.py).
EXO_SHARD = {
    "modelCard": EXO_CARD,
    "deviceRank": int,
    "worldSize": int,
    "immediateException": bool,
    "shouldTimeout": (float, int, NONE),
    "startLayer": int,
    "endLayer": int,
    "nLayers": int,
}
# MlxRingInstance (shared/types/worker/instances.py), without its tag.
EXO_RING_INSTANCE = {
    "instanceId": str,
    "shardAssignments": {"modelId": str, "runnerToShard": dict, "nodeToRunner": dict},
    "hostsByNode": dict,
    "ephemeralPort": int,
}
# CreateInstanceResponse (api/types/api.py), plus this project's instance id.
EXO_CREATED = {"message": str, "command_id": str, "model_card": EXO_CARD, "instance_id": str}
# ModelListModel (api/types/api.py).
EXO_MODEL = {
    "id": str,
    "object": str,
    "created": int,
    "owned_by": str,
    "hugging_face_id": str,
    "name": str,
    "description": str,
    "context_length": int,
    "tags": [str],
    "storage_size_megabytes": int,
    "supports_tensor": bool,
    "tasks": [str],
    "is_custom": bool,
    "family": str,
    "quantization": str,
    "base_model": str,
    "capabilities": [str],
    "reasoning_dialect": str,
}
# ImageGenerationStats (api/types/api.py).
EXO_IMAGE_STATS = {
    "seconds_per_step": float,
    "total_generation_time": float,
    "num_inference_steps": int,
    "num_images": int,
    "image_width": int,
    "image_height": int,
    "peak_memory_usage": MEMORY,
}


def conforms(value: Any, schema: Any, where: str = "") -> None:
    """Assert `value` has exactly the schema's fields, of its types."""
    if isinstance(schema, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        assert set(value) == set(schema), f"{where}: fields {sorted(set(value) ^ set(schema))}"
        for key, sub in schema.items():
            conforms(value[key], sub, f"{where}.{key}")
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            conforms(item, schema[0], f"{where}[{i}]")
    else:
        kinds = schema if isinstance(schema, tuple) else (schema,)
        ok = isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))
        assert ok, f"{where}: {value!r} is not {kinds}"


def conforms_instance(tagged: Any, model_id: str) -> dict[str, Any]:
    assert list(tagged) == ["MlxRingInstance"]
    instance = tagged["MlxRingInstance"]
    conforms(instance, EXO_RING_INSTANCE, "instance")
    assignments = instance["shardAssignments"]
    assert assignments["modelId"] == model_id
    assert set(assignments["nodeToRunner"].values()) == set(assignments["runnerToShard"])
    for shard in assignments["runnerToShard"].values():
        (tag,) = shard
        assert tag in ("PipelineShardMetadata", "TensorShardMetadata")
        conforms(shard[tag], EXO_SHARD, tag)
    return instance


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    plugins = [ScriptedEnginePlugin(), download_plugin, *DIALECTS]
    with running_node(tmp_path_factory.mktemp("exo-routes"), plugins) as n:
        yield n


MODEL = "scripted-echo"


def test_v1_models_lists_every_exo_model_with_exos_fields(node: RunningNode) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)
    listed = list(client.models.list())
    ids = {m.id for m in listed}
    card_dir = Path(__file__).parents[2] / "resources" / "model_cards"
    exo_ids = {
        tomllib.loads(p.read_text())["model_id"] for p in card_dir.glob("exo/*_model_cards/*.toml")
    }
    assert len(exo_ids) == 141 and exo_ids <= ids
    ours = {"mlx-community/SmolLM2-135M-Instruct", "black-forest-labs/FLUX.1-dev", MODEL}
    assert ours <= ids
    raw = httpx.get(f"{node.url}/v1/models").json()["data"]
    for model in raw:
        conforms(model, EXO_MODEL, model["id"])
    by_id = {m["id"]: m for m in raw}
    gemma = by_id["mlx-community/gemma-4-31b-it-4bit"]
    assert gemma["family"] == "gemma" and "vision" in gemma["capabilities"]
    assert gemma["storage_size_megabytes"] > 0 and gemma["tasks"] == ["text_generation"]
    assert by_id["mlx-community/DeepSeek-V4-Pro"]["reasoning_dialect"] == "tool_conditional"
    assert by_id["exolabs/FLUX.1-schnell-8bit"]["tasks"] == ["image_generation"]


def test_feature_flags(node: RunningNode) -> None:
    assert httpx.get(f"{node.url}/v1/feature-flags").json() == {"disaggregation": False}


def test_placement_is_exos_instance_and_creates_nothing(node: RunningNode) -> None:
    query = {"model_id": MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing"}
    answer = httpx.get(f"{node.url}/instance/placement", params=query)
    assert answer.status_code == 200, answer.text
    instance = conforms_instance(answer.json(), MODEL)
    assert instance["instanceId"] not in node.node.state.instances


def test_place_instance_then_await_it(node: RunningNode) -> None:
    await_url = f"{node.url}/instance/await"
    waited = httpx.get(await_url, params={"model_id": MODEL, "timeout_seconds": 0.2})
    assert waited.headers["content-type"].startswith("text/event-stream")
    assert _sse_data(waited.text) == [
        {"type": "timeout", "message": f"No instance found for model {MODEL}"}
    ]
    body = {"model_id": MODEL, "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": 1}
    placed = httpx.post(f"{node.url}/place_instance", json=body)
    assert placed.status_code == 200, placed.text
    created = placed.json()
    conforms(created, EXO_CREATED, "created")
    assert created["model_card"]["modelId"] == MODEL
    assert created["instance_id"] in node.node.state.instances
    ready = _sse_data(httpx.get(await_url, params={"model_id": MODEL}, timeout=10).text)
    assert [m["type"] for m in ready] == ["ready"]
    instance = conforms_instance(ready[0]["instance"], MODEL)
    assert instance["instanceId"] == created["instance_id"]
    deleted = httpx.delete(f"{node.url}/instance/{created['instance_id']}")
    assert deleted.status_code == 200


def _sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_previews_keep_only_placements_with_the_nodes_asked_for(node: RunningNode) -> None:
    url = f"{node.url}/instance/previews"
    mine = httpx.get(url, params={"model_id": MODEL, "node_ids": [node.node_id]}).json()
    assert mine["previews"] and all(
        node.node_id in [n["node_id"] for n in p["nodes"]] for p in mine["previews"]
    )
    unknown = httpx.get(url, params={"model_id": MODEL, "node_ids": ["node-nobody"]})
    assert unknown.status_code == 404 and "node-nobody" in unknown.json()["detail"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model_id": MODEL, "instance_meta": "MlxJaccl"}, 400, "MlxRing"),
        ({"model_id": MODEL, "instance_meta": "Ring"}, 422, "instance_meta"),
        ({"model_id": MODEL, "sharding": "Diagonal"}, 422, "sharding"),
        ({"model_id": MODEL, "min_nodes": 0}, 422, "min_nodes"),
        ({"model_id": MODEL, "min_nodes": 5}, 409, "min_nodes=5"),
        ({"model_id": MODEL, "node_ids": ["node-nobody"]}, 404, "node-nobody"),
        ({"model_id": "org/unknown"}, 404, "unknown model"),
        ({"sharding": "Pipeline"}, 422, "model_id"),
        ({"model_id": MODEL, "extra": 1}, 422, "extra"),
        ([MODEL], 422, "object"),
    ],
)
def test_place_instance_refuses_bad_bodies(
    node: RunningNode, body: object, status: int, words: str
) -> None:
    answer = httpx.post(f"{node.url}/place_instance", json=body)
    assert answer.status_code == status, answer.text
    assert words in answer.text
    assert not node.node.state.instances


@pytest.mark.parametrize(
    ("route", "query", "status", "words"),
    [
        ("placement", {"model_id": "org/unknown"}, 404, "unknown model"),
        ("placement", {"model_id": MODEL, "sharding": "pipeline"}, 422, "sharding"),
        ("placement", {"model_id": MODEL, "instance_meta": "MlxJaccl"}, 400, "MlxRing"),
        # Listed, but no engine here runs the family: refused with the reason.
        ("placement", {"model_id": "mlx-community/DeepSeek-V4-Flash"}, 400, "cannot place"),
        ("placement", {}, 422, "model_id"),
        ("await", {"model_id": MODEL, "timeout_seconds": 301}, 422, "timeout_seconds"),
        ("await", {"model_id": MODEL, "timeout_seconds": -1}, 422, "timeout_seconds"),
        ("await", {"model_id": "org/unknown"}, 404, "unknown model"),
    ],
)
def test_instance_queries_refuse_bad_input(
    node: RunningNode, route: str, query: dict[str, Any], status: int, words: str
) -> None:
    answer = httpx.get(f"{node.url}/instance/{route}", params=query)
    assert answer.status_code == status, answer.text
    assert words in answer.text


def test_ollama_head_probe_with_a_trailing_slash(node: RunningNode) -> None:
    assert httpx.head(f"{node.url}/ollama/").status_code == 200


# -- the image bench and exo's advanced_params (pure parts; the routes run in engine_mflux's
# tests against a real image model) ----------------------------------------------------------


def test_num_sync_steps_is_accepted_in_exos_bounds() -> None:
    ok = images.ImagesRequest(prompt="x", advanced_params=images.AdvancedParams(num_sync_steps=100))
    assert images.to_image_request(ok).prompt == "x"
    for bad in (0, 101):
        req = images.ImagesRequest(
            prompt="x", advanced_params=images.AdvancedParams(num_sync_steps=bad)
        )
        with pytest.raises(InvalidRequest, match="num_sync_steps must be between 1 and 100"):
            images.to_image_request(req)


def test_bench_stats_have_exos_fields() -> None:
    task = TaskId("t")
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
    chunks = [
        ProgressChunk(task_id=task, step=1, total=2),
        ProgressChunk(task_id=task, step=2, total=2),
        ImageChunk(task_id=task, index=0, data=png, width=64, height=32),
        FinishChunk(
            task_id=task, finish_reason=FinishReason.STOP, usage=Usage(peak_memory_bytes=5)
        ),
    ]
    clock = StepClock()
    clock.steps = [clock.started + 1.0, clock.started + 3.0]
    clock.ended = clock.started + 4.0
    stats = clock.stats(chunks)
    conforms(stats, EXO_IMAGE_STATS, "generation_stats")
    assert stats["seconds_per_step"] == pytest.approx(2.0)
    assert stats["total_generation_time"] == pytest.approx(4.0)
    assert (stats["num_inference_steps"], stats["num_images"]) == (2, 1)
    assert (stats["image_width"], stats["image_height"]) == (64, 32)
    assert stats["peak_memory_usage"] == {"inBytes": 5}


def test_native_post_instance_takes_exos_body_too(node: RunningNode) -> None:
    body = {"model_id": MODEL, "sharding": "Tensor", "instance_meta": "MlxRing", "min_nodes": 1}
    placed = httpx.post(f"{node.url}/instance", json={**body, "node_ids": [node.node_id]})
    assert placed.status_code == 201, placed.text
    instance = node.node.state.instances[placed.json()["instance_id"]]
    assert instance.sharding == "tensor"
    assert httpx.delete(f"{node.url}/instance/{instance.instance_id}").status_code == 200
    jaccl = httpx.post(f"{node.url}/instance", json={**body, "instance_meta": "MlxJaccl"})
    assert jaccl.status_code == 400 and "MlxRing" in jaccl.json()["detail"]
