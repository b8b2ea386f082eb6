"""Request bodies never enter the replicated log: prompts, images, tools and stop strings travel
from the API node to rank 0 only, and appear in no node's files, `/events` or `/state`."""

from __future__ import annotations

import base64
import json
import os
from contextlib import aclosing
from pathlib import Path

import anthropic
import httpx
import msgspec
import ollama
import openai
import pytest

import exo_api_claude.plugin
import exo_api_ollama.plugin
import exo_api_openai.plugin
from exo_core.bodies import BodyStore, BodyUnavailable
from exo_core.config import NodeConfig
from exo_core.events import TaskCreated, TaskStatusChanged
from exo_core.generation import ChatMessage, ErrorChunk, GenerationParams, TextChunk
from exo_core.hookspecs import hookimpl
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.model_cards import Capability, ModelCard
from exo_core.state import Instance, ShardAssignment, State, Task, TaskStatus
from exo_core.testing.harness import RunningNode, events_text, running_cluster, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

DIALECTS = [exo_api_openai.plugin, exo_api_claude.plugin, exo_api_ollama.plugin]
SECRET = "SECRET-7f3a-prompt"
# An image only the data plane may carry (a PNG's signature, then noise: the API checks the
# signature, and only a runner decodes the rest).
IMAGE = base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(600)).decode()
VISION = ModelCard(
    model_id=ModelId("scripted-vision"),
    family="scripted",
    n_layers=4,
    hidden_size=64,
    storage_size_bytes=1_000_000,
    capabilities=(Capability.TEXT, Capability.VISION),
    source="scripted:echo",
)


class VisionCard:
    @hookimpl
    def exo_model_cards(self, config: NodeConfig) -> list[ModelCard]:
        return [VISION]


def plugins(i: int = 0) -> list[object]:
    return [ScriptedEnginePlugin(), VisionCard(), *DIALECTS]


def ask_every_dialect(url: str) -> None:
    """Real requests through the official clients; each answer proves rank 0 got the body."""
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    chat = oai.chat.completions.create(
        model="scripted-vision",
        messages=[
            {"role": "system", "content": f"system {SECRET}"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"look {SECRET}"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                ],
            },
        ],
        stop=[f"stop-{SECRET}"],
    )
    assert SECRET in (chat.choices[0].message.content or "")
    tools = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": f"call {SECRET}"}],
        tools=[
            {
                "type": "function",
                "function": {"name": "lookup", "description": f"tool {SECRET}", "parameters": {}},
            }
        ],
    )
    assert tools.choices[0].message.tool_calls
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with claude.messages.stream(
        model="scripted-echo",
        max_tokens=32,
        messages=[{"role": "user", "content": f"hi {SECRET}"}],
    ) as stream:
        assert SECRET in "".join(stream.text_stream)
    raw = ollama.Client(host=url).generate(
        model="scripted-echo", prompt=f"raw {SECRET}", raw=True, stream=False
    )
    assert SECRET in raw.response


def assert_private(node: RunningNode, data_dir: Path) -> None:
    for path in data_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data, f"a prompt is stored in {path}"
            assert IMAGE.encode() not in data, f"an image is stored in {path}"
    assert SECRET not in httpx.get(f"{node.url}/state").text
    served = events_text(node.url)
    assert "TaskCreated" in served
    assert SECRET not in served and IMAGE not in served


def test_prompts_never_reach_the_log_events_or_state(tmp_path: Path) -> None:
    with running_node(tmp_path, plugins()) as node:
        ask_every_dialect(node.url)
        created = [e for e in node.node.replica.log if isinstance(e.event, TaskCreated)]
        assert len(created) == 4
        assert_private(node, tmp_path)


def test_rank_0_on_another_node_fetches_the_body_from_the_api_node(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 3, plugins) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 3 for n in cluster.nodes))
        for model in ("scripted-echo", "scripted-vision"):
            placed = httpx.post(
                f"{cluster.nodes[0].url}/instance", json={"model_id": model, "min_nodes": 2}
            )
            assert placed.status_code == 201, placed.text
        cluster.wait(cluster.converged)
        state = cluster.nodes[0].node.state
        leaders = {i.leader.node_id for i in state.instances.values()}
        api = next(n for n in cluster.nodes if n.node_id not in leaders)
        ask_every_dialect(api.url)
        cluster.wait(lambda: cluster.converged() and not api.node.state.tasks)
        for i, node in enumerate(cluster.nodes):
            assert_private(node, tmp_path / f"node{i}")
        assert len(api.node.bodies) == 0, "bodies are let go once their callers are answered"


def test_a_body_that_cannot_be_fetched_fails_the_task_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_cluster(tmp_path, 2, plugins) as cluster:
        cluster.wait(lambda: all(len(n.node.state.nodes) == 2 for n in cluster.nodes))
        placed = httpx.post(f"{cluster.nodes[0].url}/instance", json={"model_id": "scripted-echo"})
        assert placed.status_code == 201, placed.text
        cluster.wait(cluster.converged)
        leader = next(iter(cluster.nodes[0].node.state.instances.values())).leader.node_id
        api = next(n for n in cluster.nodes if n.node_id != leader)
        monkeypatch.setattr(api.node.bodies, "hold", lambda task: None)  # the body is lost

        async def ask() -> list[object]:
            params = GenerationParams(messages=(ChatMessage(role="user", content=SECRET),))
            stream = await api.node.generation.generate("scripted-echo", params)
            async with aclosing(stream) as chunks:
                return [c async for c in chunks]

        chunks = api.call(ask)
        assert not any(isinstance(c, TextChunk) for c in chunks)
        error = chunks[-1]
        assert isinstance(error, ErrorChunk)
        assert "did not hand over the request" in error.message
        cluster.wait(lambda: not api.node.state.tasks)
        failed = [
            e.event
            for e in api.node.replica.log
            if isinstance(e.event, TaskStatusChanged) and e.event.status == TaskStatus.FAILED
        ]
        assert failed and "no request is waiting" in (failed[-1].error or "")


def test_only_rank_0_of_the_tasks_instance_gets_a_body() -> None:
    shards = tuple(
        ShardAssignment(
            node_id=NodeId(f"n{k}"),
            runner_id=RunnerId(f"i-r{k}"),
            rank=k,
            world_size=2,
            start_layer=k,
            end_layer=k + 1,
        )
        for k in range(2)
    )
    instance = Instance(
        instance_id=InstanceId("i"), model_id=ModelId("m"), sharding="pipeline", shards=shards
    )
    state = State(instances={instance.instance_id: instance})
    params = GenerationParams(messages=(ChatMessage(role="user", content=SECRET),))
    task = Task(
        task_id=TaskId("t"),
        instance_id=instance.instance_id,
        model_id=ModelId("m"),
        origin_node=NodeId("n1"),
        params=params,
    )
    store = BodyStore()
    store.hold(task)
    assert store.lend(task.task_id, NodeId("n0"), state).params == params
    for asker, why in ((NodeId("n1"), "does not run rank 0"), (NodeId("x"), "does not run")):
        with pytest.raises(BodyUnavailable, match=why):
            store.lend(task.task_id, asker, state)
    with pytest.raises(BodyUnavailable, match="no request is waiting"):
        store.lend(TaskId("other"), NodeId("n0"), state)
    store.release(task.task_id)
    with pytest.raises(BodyUnavailable):
        store.lend(task.task_id, NodeId("n0"), state)
    assert SECRET not in json.dumps(msgspec.to_builtins(state))
