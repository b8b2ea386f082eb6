"""Each dialect against the real SmolLM2 model on the MLX engine.

Asserts structure only (text, finish reason, usage): the model's answers are not stable enough
for exact strings. Skips until the MLX engine plugin provides `exo_engines`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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


COUNTING: Any = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]
PENALTIES = {"presence_penalty": 1.0, "frequency_penalty": 1.5}


@pytest.mark.timeout(600)
def test_penalties_change_greedy_text_in_the_dialects_that_have_them(served: Served) -> None:
    """OpenAI chat and Ollama's options carry presence and frequency penalties (Anthropic and
    the Responses API have none): a counting answer repeats its commas, which they punish."""
    oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=300)

    def chat(**extra: Any) -> str:
        r = oai.chat.completions.create(
            model=served.model, messages=COUNTING, temperature=0, max_tokens=24, **extra
        )
        return r.choices[0].message.content or ""

    assert chat(**PENALTIES) != chat()
    olla = ollama.Client(host=served.url, timeout=300)

    def ollama_chat(**extra: Any) -> str:
        options = {"temperature": 0, "num_predict": 24, **extra}
        return (
            olla.chat(model=served.model, messages=COUNTING, options=options).message.content or ""
        )

    assert ollama_chat(**PENALTIES) != ollama_chat()


def test_penalties_out_of_range_are_refused_in_each_dialects_format(served: Served) -> None:
    oai = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=30)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(
            model=served.model, messages=COUNTING, max_tokens=4, presence_penalty=2.5
        )
    assert "presence_penalty" in str(refused.value)
    olla = ollama.Client(host=served.url, timeout=30)
    with pytest.raises(ollama.ResponseError) as refused_ollama:
        olla.chat(model=served.model, messages=COUNTING, options={"frequency_penalty": -3})
    assert refused_ollama.value.status_code == 400
    assert "options.frequency_penalty" in str(refused_ollama.value)
