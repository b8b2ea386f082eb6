"""Each dialect against the real SmolLM2 model on the MLX engine.

Asserts structure only (text, finish reason, usage): the model's answers are not stable enough
for exact strings. Skips until the MLX engine plugin provides `exo_engines`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import ollama
import openai
import pytest

from exo_core.model_cards import Capability, ModelCard
from exo_core.node import Node
from exo_core.testing.harness import running_node

from .support import DIALECTS

pytestmark = pytest.mark.smollm

QUESTION = "What is the capital of France?"
MAX_TOKENS = 8


@dataclass
class Served:
    url: str
    model: str


def _mlx_plugin() -> object:
    try:
        plugin = importlib.import_module("exo_engine_mlx.plugin")
    except ImportError as e:
        pytest.skip(f"exo_engine_mlx is not importable: {e}")
    if not hasattr(plugin, "exo_engines"):
        pytest.skip("exo_engine_mlx.plugin has no exo_engines yet (the MLX engine is in progress)")
    return plugin


def _pick(node: Node) -> ModelCard:
    """A text model the MLX engine can serve, preferring the one shipped in a package."""
    cards = [
        c
        for c in node.cards().values()
        if c.has(Capability.TEXT) and any(e.can_serve(c) for e in node.engines)
    ]
    if not cards:
        pytest.skip("the MLX engine serves none of this node's model cards")
    cards.sort(key=lambda c: (not c.source.startswith("embedded:"), c.model_id))
    return cards[0]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    plugin = _mlx_plugin()
    with running_node(tmp_path_factory.mktemp("smollm"), [plugin, *DIALECTS]) as running:
        yield Served(running.url, _pick(running.node).model_id)


@pytest.mark.timeout(600)
def test_openai(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=300)
    r = client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    choice = r.choices[0]
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.prompt_tokens > 0
    assert 1 <= r.usage.completion_tokens <= MAX_TOKENS
    stream = client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.timeout(600)
def test_claude(served: Served) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", timeout=300)
    m = client.messages.create(
        model=served.model,
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},
    )
    texts = [b.text for b in m.content if b.type == "text"]
    assert texts and "".join(texts).strip()
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 1 <= m.usage.output_tokens <= MAX_TOKENS


@pytest.mark.timeout(600)
def test_ollama(served: Served) -> None:
    client = ollama.Client(host=served.url, timeout=300)
    r = client.chat(
        model=served.model,
        messages=[{"role": "user", "content": QUESTION}],
        options={"temperature": 0, "num_predict": MAX_TOKENS},
    )
    assert r.message.content and r.message.content.strip()
    assert r.done and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    assert r.eval_count is not None and 1 <= r.eval_count <= MAX_TOKENS
