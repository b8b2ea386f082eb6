"""Instances over several nodes: real MLX runners forming a ring, served through the OpenAI
endpoint of a node, on the in-memory cluster (nodes in this process, runners as subprocesses).

Greedy text from two- and three-node pipelines and a three-node tensor group on SmolLM2, and a
two-node tensor group on a tiny random model, equals the single node's; a killed rank ends the
caller's request with an error and the group forms again.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import exo_api_openai.plugin
import exo_engine_mlx.plugin
from exo_core.config import NodeConfig
from exo_core.hookspecs import hookimpl
from exo_core.ids import InstanceId, ModelId
from exo_core.model_cards import ModelCard
from exo_core.state import RunnerStatus
from exo_core.testing.harness import RunningCluster, running_cluster
from exo_engine_mlx.cards import EMBEDDED_MODEL_ID
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.runner import MlxRunner
from exo_engine_mlx.testing import float_activations
from exo_engine_mlx.tiny_model import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

TINY = ModelId("tiny-tensor")
QUESTION = "What is the capital of France?"


class TinyCard:
    """A card for a tiny random llama (4 heads, 2 KV heads) in a local directory."""

    def __init__(self, path: Path) -> None:
        self.card = ModelCard(
            model_id=TINY,
            family="llama",
            n_layers=4,
            hidden_size=64,
            num_key_value_heads=2,
            storage_size_bytes=1_000_000,
            supports_tensor=True,
            source=f"local:{path}",
        )

    @hookimpl
    def exo_model_cards(self, config: NodeConfig) -> list[ModelCard]:
        return [self.card]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    tiny = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", layers=4)
    cards = TinyCard(tiny)

    def plugins(i: int) -> list[object]:
        return [exo_engine_mlx.plugin, exo_api_openai.plugin, cards]

    root = tmp_path_factory.mktemp("cluster")
    # Float activations: a tensor split's text equals one node's token for token only there.
    with float_activations(), running_cluster(root, 3, plugins, auto_place=False) as c:
        c.wait(lambda: all(len(n.node.state.nodes) == 3 for n in c.nodes), timeout=30)
        c.wait(
            lambda: all(n.resources.engines for n in c.nodes[0].node.state.nodes.values()),
            timeout=30,
        )
        yield c


def _place(cluster: RunningCluster, model: str, sharding: str, nodes: int) -> str:
    url = cluster.nodes[0].url
    body = {"model_id": model, "sharding": sharding, "min_nodes": nodes}
    created = httpx.post(f"{url}/instance", json=body, timeout=30)
    assert created.status_code == 201, created.text
    instance_id = created.json()["instance_id"]
    state = cluster.nodes[0].node.state
    assert len(state.instances[InstanceId(instance_id)].shards) == nodes
    _wait_ready(cluster, instance_id)
    return instance_id


def _runner_statuses(cluster: RunningCluster, instance_id: str) -> list[RunnerStatus | None]:
    state = cluster.nodes[0].node.state
    instance = state.instances.get(InstanceId(instance_id))
    if instance is None:
        return []
    return [
        info.status if (info := state.runners.get(s.runner_id)) else None for s in instance.shards
    ]


def _wait_ready(cluster: RunningCluster, instance_id: str, timeout: float = 120) -> None:
    cluster.wait(
        lambda: (
            (s := _runner_statuses(cluster, instance_id))
            and all(x == RunnerStatus.READY for x in s)
        ),
        timeout=timeout,
    )


def _delete(cluster: RunningCluster, instance_id: str) -> None:
    httpx.delete(f"{cluster.nodes[0].url}/instance/{instance_id}", timeout=30)
    cluster.wait(lambda: not _runners_alive(cluster), timeout=30)


def _runners_alive(cluster: RunningCluster) -> list[Any]:
    return [r for n in cluster.nodes for r in _local_runners(n)]


def _local_runners(node: Any) -> list[MlxRunner]:
    worker = node.node.worker
    return [x.runner for x in worker._locals.values() if isinstance(x.runner, MlxRunner)]


def _ask(cluster: RunningCluster, model: str, node: int = 1, max_tokens: int = 24) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    reply = httpx.post(f"{cluster.nodes[node].url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def _served(cluster: RunningCluster, model: str, sharding: str, nodes: int) -> str:
    instance_id = _place(cluster, model, sharding, nodes)
    try:
        return _ask(cluster, model)
    finally:
        _delete(cluster, instance_id)


@pytest.fixture(scope="module")
def single_node_text(cluster: RunningCluster) -> str:
    return _served(cluster, EMBEDDED_MODEL_ID, "pipeline", 1)


def test_two_and_three_node_pipelines_give_the_single_node_text(
    cluster: RunningCluster, single_node_text: str
) -> None:
    assert single_node_text
    assert _served(cluster, EMBEDDED_MODEL_ID, "pipeline", 2) == single_node_text
    assert _served(cluster, EMBEDDED_MODEL_ID, "pipeline", 3) == single_node_text


def test_three_node_tensor_gives_the_single_node_text(
    cluster: RunningCluster, single_node_text: str
) -> None:
    assert _served(cluster, EMBEDDED_MODEL_ID, "tensor", 3) == single_node_text


def test_previews_offer_no_two_node_tensor_for_three_kv_heads(cluster: RunningCluster) -> None:
    params = {"model_id": EMBEDDED_MODEL_ID, "sharding": "tensor", "min_nodes": 2}
    body = httpx.get(f"{cluster.nodes[0].url}/instance/previews", params=params).json()
    assert [len(p["nodes"]) for p in body["previews"]] == [3]
    assert all(n["end_layer"] == 30 for n in body["previews"][0]["nodes"])


def test_two_node_tensor_on_a_tiny_model_gives_the_single_node_text(
    cluster: RunningCluster,
) -> None:
    single = _served(cluster, TINY, "pipeline", 1)
    assert _served(cluster, TINY, "tensor", 2) == single


def test_a_killed_rank_fails_the_request_then_the_group_forms_again(
    cluster: RunningCluster,
) -> None:
    instance_id = _place(cluster, EMBEDDED_MODEL_ID, "pipeline", 2)
    try:
        state = cluster.nodes[0].node.state
        follower = state.instances[InstanceId(instance_id)].shards[1]
        holder = next(n for n in cluster.nodes if n.node_id == follower.node_id)
        (runner,) = _local_runners(holder)
        body = {
            "model": EMBEDDED_MODEL_ID,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 2000,
            "temperature": 0,
            "stream": True,
        }
        url = f"{cluster.nodes[0].url}/v1/chat/completions"
        lines: list[str] = []
        killed_at = 0.0
        with httpx.stream("POST", url, json=body, timeout=60) as reply:
            for line in reply.iter_lines():
                lines.append(line)
                if not killed_at and '"content"' in line:
                    assert runner.pid is not None
                    os.kill(runner.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
        took = time.monotonic() - killed_at
        print(f"the caller's stream ended {took:.3f} s after the kill: {lines[-2:]}")
        assert killed_at and took < 10, took
        assert any("error" in line for line in lines), lines[-3:]
        # The workers restart both ranks (after their backoff) and the group serves again.
        _wait_ready(cluster, instance_id, timeout=90)
        print(f"the group was ready again {time.monotonic() - killed_at:.1f} s after the kill")
        assert _ask(cluster, EMBEDDED_MODEL_ID, max_tokens=4)
    finally:
        _delete(cluster, instance_id)


def test_engine_is_the_mlx_one(cluster: RunningCluster) -> None:
    assert any(isinstance(e, MlxEngine) for e in cluster.nodes[0].node.engines)
