"""Presence and frequency penalties: on the answer's tokens only, per request in a batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest

from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.sampling import make_processors, output_penalties
from exo_engine_mlx.testing import run_requests as run
from exo_engine_mlx.testing import text_of as text
from exo_engine_mlx.tiny_model import make_tiny_model

GREEDY = SamplingParams(temperature=0)
PENALISED = SamplingParams(temperature=0, presence_penalty=1.0, frequency_penalty=1.5)


def _row(logits: mx.array) -> list[float]:
    rows: Any = logits.tolist()
    return rows[0]


def test_penalties_count_the_answer_not_the_prompt() -> None:
    penalise = output_penalties(presence=0.5, frequency=2.0, prompt_tokens=3)
    # Prompt [1, 1, 4], answer so far [5, 5, 7]: token 1 and 4 are the prompt's, untouched.
    tokens = mx.array([1, 1, 4, 5, 5, 7])
    out = _row(penalise(tokens, mx.zeros((1, 10))))
    assert out[5] == pytest.approx(-(0.5 + 2 * 2.0))
    assert out[7] == pytest.approx(-(0.5 + 2.0))
    assert out[1] == out[4] == out[0] == 0.0
    # Nothing generated yet: the logits are unchanged.
    assert _row(penalise(tokens[:3], mx.ones((1, 10)))) == [1.0] * 10


def test_negative_penalties_favour_repeats() -> None:
    penalise = output_penalties(presence=-1.0, frequency=0.0, prompt_tokens=0)
    assert _row(penalise(mx.array([2]), mx.zeros((1, 4)))) == [0.0, 0.0, 1.0, 0.0]


def test_zero_penalties_add_no_processor() -> None:
    assert make_processors(GREEDY, prompt_tokens=5) == []
    assert len(make_processors(PENALISED, prompt_tokens=5)) == 1


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model_dir: Path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return mlx_lm.load(str(model_dir))[:2]  # type: ignore[return-value]


def params(sampling: SamplingParams, prompt: str = "hello world") -> GenerationParams:
    return GenerationParams(
        messages=(ChatMessage(role="user", content=prompt),), sampling=sampling, max_tokens=24
    )


def test_penalties_change_greedy_text_from_the_second_token(loaded: tuple[Any, Any]) -> None:
    plain = text(run(BatchEngine(*loaded), {"t": params(GREEDY)})["t"])
    penalised = text(run(BatchEngine(*loaded), {"t": params(PENALISED)})["t"])
    assert penalised != plain
    # The first token sees no answer yet, so the prompt's own tokens are not penalised.
    tokenizer = loaded[1]
    assert tokenizer.encode(penalised)[:1] == tokenizer.encode(plain)[:1]


def test_each_request_keeps_its_own_penalties_in_a_batch(loaded: tuple[Any, Any]) -> None:
    solo = {
        name: text(run(BatchEngine(*loaded), {name: params(s)})[name])
        for name, s in (("plain", GREEDY), ("penalised", PENALISED))
    }
    together = run(BatchEngine(*loaded), {"plain": params(GREEDY), "penalised": params(PENALISED)})
    assert {name: text(chunks) for name, chunks in together.items()} == solo


def test_a_prefix_cache_hit_penalises_the_same(loaded: tuple[Any, Any]) -> None:
    cache = PrefixCache(budget_bytes=64 * 1024 * 1024)
    engine = BatchEngine(*loaded, prefix_cache=cache)
    first = text(run(engine, {"a": params(PENALISED, "a longer prompt to cache here")})["a"])
    again = text(run(engine, {"b": params(PENALISED, "a longer prompt to cache here")})["b"])
    assert cache.hits == 1
    assert again == first


def test_one_cache_per_request_penalises_like_the_batch(loaded: tuple[Any, Any]) -> None:
    batched = text(run(BatchEngine(*loaded), {"t": params(PENALISED)})["t"])
    solo = text(run(BatchEngine(*loaded, batched=False), {"t": params(PENALISED)})["t"])
    assert solo == batched
