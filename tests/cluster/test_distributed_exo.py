"""Instances over several real `exo` processes on loopback (libp2p transport, election,
replicated log), served through the OpenAI endpoint: the greedy text of SmolLM2 from two- and
three-node pipelines and a three-node tensor group equals one node's, and so does a tiny random
model's over a two-node tensor group, and a tiny Llama 4's (a family mlx-lm's batch generator
cannot batch) over a two-node pipeline, asked twice at once through the official client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from msgspec.structs import replace

from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard
from exo_core.testing.processes import (
    ExoProcess,
    exo_processes,
    runners_ready,
    wait_joined,
    wait_until,
)
from exo_engine_mlx.cards import write_imported_card
from exo_engine_mlx.family_sweep import PROMPT, tiny_card
from exo_engine_mlx.testing import float_activations
from exo_engine_mlx.tiny_model import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

MODEL = "SmolLM2-135M-Instruct"
TINY = "tiny-random-llama"
LLAMA4 = "tiny-random-llama4"
QUESTION = "What is the capital of France?"


def TINY_CARD(path: Path) -> ModelCard:
    return ModelCard(
        model_id=ModelId(TINY), family="llama", n_layers=4, hidden_size=64,
        num_key_value_heads=2, storage_size_bytes=1_000_000, supports_tensor=True,
        source=f"local:{path}",
    )  # fmt: skip


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ExoProcess]]:
    root = tmp_path_factory.mktemp("exo")
    for i in range(3):
        # A tiny random model with 2 KV heads, found by each node as an imported model.
        model_dir = make_tiny_model(root / f"node{i}" / "models" / TINY, layers=4)
        write_imported_card(model_dir, TINY_CARD(model_dir))
        llama4 = root / f"node{i}" / "models" / LLAMA4
        make_tiny_model(llama4, model_type="llama4", layers=4)
        card = tiny_card("llama4")
        write_imported_card(
            llama4, replace(card, model_id=ModelId(LLAMA4), source=f"local:{llama4}")
        )
    # Float activations: a tensor split's text equals one node's token for token only there.
    with (
        float_activations(),
        exo_processes(root, 3, extra_args=[["--no-auto-place"]] * 3) as started,
    ):
        wait_joined(started)
        yield started


def _created(node: ExoProcess, body: dict[str, Any]) -> str:
    """The id of a new instance of the body's model. Under heavy load a placement can outlive
    its answer: a 503 (the master did not replicate it in time) or a 500 (this node's replica
    did not catch up within the API's 5 s) may still place it, so the state is asked; the
    placement is asked again only while no instance of the model is there."""
    model = body["model_id"]
    placed: list[str] = []

    def instance_id() -> str | None:
        instances: dict[str, Any] = node.state()["instances"]
        return next((i for i, inst in instances.items() if inst["model_id"] == model), None)

    def done() -> bool:
        if (found := instance_id()) is not None:
            placed.append(found)
            return True
        reply = httpx.post(f"{node.url}/instance", json=body, timeout=30)
        if reply.status_code == 201:
            placed.append(str(reply.json()["instance_id"]))
            return True
        assert reply.status_code in (500, 503), reply.text
        return False

    wait_until(done, timeout=180, interval=5)
    return placed[-1]


def _served(
    nodes: list[ExoProcess],
    sharding: str,
    count: int,
    model: str = MODEL,
    ask: Callable[[str], str] | None = None,
) -> str:
    """The greedy answer of an instance of `model` over `count` nodes (`ask`: how to ask the
    last node's URL; a plain POST when None)."""
    first = nodes[0]
    body = {"model_id": model, "sharding": sharding, "min_nodes": count}
    instance_id = _created(first, body)
    try:
        assert len(first.get(f"/instance/{instance_id}")["shards"]) == count
        wait_until(lambda: runners_ready(first, instance_id), timeout=180)
        if ask is not None:
            return ask(nodes[-1].url)
        body = {
            "model": model,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 24,
            "temperature": 0,
        }
        # Asked on the last node: chunks cross the transport from rank 0's node.
        reply = httpx.post(f"{nodes[-1].url}/v1/chat/completions", json=body, timeout=180)
        assert reply.status_code == 200, reply.text
        return str(reply.json()["choices"][0]["message"]["content"])
    finally:
        httpx.delete(f"{first.url}/instance/{instance_id}", timeout=30)
        wait_until(lambda: instance_id not in first.state()["instances"], timeout=30)


def test_pipelines_and_tensor_over_exo_processes_give_one_nodes_text(
    nodes: list[ExoProcess],
) -> None:
    single = _served(nodes, "pipeline", 1)
    assert single
    assert _served(nodes, "pipeline", 2) == single
    assert _served(nodes, "pipeline", 3) == single
    assert _served(nodes, "tensor", 3) == single


def test_two_node_tensor_on_a_tiny_model_over_exo_processes(nodes: list[ExoProcess]) -> None:
    single = _served(nodes, "pipeline", 1, TINY)
    assert _served(nodes, "tensor", 2, TINY) == single


def test_a_tiny_llama4_pipeline_answers_two_requests_at_once_as_one_rank_alone(
    nodes: list[ExoProcess], tmp_path: Path
) -> None:
    from exo_engine_mlx.family_sweep import generate
    from exo_engine_mlx.loading import load_model

    model_dir = make_tiny_model(tmp_path / "m", model_type="llama4", layers=4)
    alone = generate(*load_model(str(model_dir)), max_tokens=8)

    def twice(url: str) -> str:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=180)
        messages: Any = [{"role": "user", "content": PROMPT}]

        def plain() -> str:
            r = client.chat.completions.create(
                model=LLAMA4, messages=messages, max_tokens=8, temperature=0
            )
            return r.choices[0].message.content or ""

        def streamed() -> str:
            stream = client.chat.completions.create(
                model=LLAMA4, messages=messages, max_tokens=8, temperature=0, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        with ThreadPoolExecutor(2) as pool:
            first, second = pool.submit(plain), pool.submit(streamed)
            texts = {first.result(), second.result()}
        assert len(texts) == 1, texts
        return texts.pop()

    assert _served(nodes, "pipeline", 2, LLAMA4, twice) == alone.text
