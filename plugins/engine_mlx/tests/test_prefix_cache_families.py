"""The prefix cache with every cache type: plain KV (cut back to any common prefix), the
hybrid attention/SSM caches of Qwen3-Next and deepseek_v41's compressed layer cache (reused
only as a whole prefix), and llama4's chunked attention (cut back no further than the first
chunk it still holds whole).

Caches are filled by the real model; a reused cache must give the same logits as computing
the whole prompt afresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

from exo_engine_mlx.prefix_cache import PrefixCache, shortest_cut
from exo_engine_mlx.tiny_model import make_tiny_model

STORED = "hello world the quick brown fox"
NEXT = STORED + " jumps over the lazy dog"
DIVERGING = "hello world numbers like 12345 and more"


CUTTABLE = {"llama", "llama4"}  # when filled in one call (llama4 drops no key then)


@pytest.fixture(scope="module", params=["llama", "qwen3_next", "llama4", "deepseek_v41"])
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = make_tiny_model(
        tmp_path_factory.mktemp(request.param) / "m", model_type=request.param, layers=4
    )
    return request.param, *mlx_lm.load(str(path))


def _fill(model: Any, tokens: list[int], cache: list[Any] | None = None) -> tuple[Any, list[Any]]:
    """Run `tokens` through the model into `cache` (a new one by default): last logits, cache."""
    cache = cache if cache is not None else make_prompt_cache(model)
    logits = model(mx.array([tokens]), cache=cache)[:, -1, :]
    mx.eval(logits)
    return logits, cache


def test_a_prompt_that_extends_a_stored_one_reuses_all_of_it(loaded: Any) -> None:
    _, model, tokenizer = loaded
    stored, tokens = tokenizer.encode(STORED), tokenizer.encode(NEXT)
    assert tokens[: len(stored)] == stored
    prefix = PrefixCache(64 << 20, min_tokens=4)
    prefix.store(stored, _fill(model, stored)[1])
    cache, n = prefix.lookup(tokens)
    assert n == len(stored) and cache is not None
    reused, _ = _fill(model, tokens[n:], cache)
    fresh, _ = _fill(model, tokens)
    assert mx.allclose(reused, fresh, atol=1e-4).item()
    # The stored entry was not changed by that use: it serves again.
    again, m = prefix.lookup(tokens)
    assert m == n and again is not None
    assert mx.allclose(_fill(model, tokens[m:], again)[0], fresh, atol=1e-4).item()


def test_only_cuttable_caches_reuse_part_of_a_stored_prompt(loaded: Any) -> None:
    family, model, tokenizer = loaded
    stored, tokens = tokenizer.encode(STORED), tokenizer.encode(DIVERGING)
    shared = next(i for i, (a, b) in enumerate(zip(stored, tokens, strict=False)) if a != b)
    prefix = PrefixCache(64 << 20, min_tokens=2)
    prefix.store(stored, _fill(model, stored)[1])
    cache, n = prefix.lookup(tokens)
    if family in CUTTABLE:  # plain KV: cut back to the shared part
        assert n == shared and cache is not None
        reused, fresh = _fill(model, tokens[n:], cache)[0], _fill(model, tokens)[0]
        assert mx.allclose(reused, fresh, atol=1e-4).item()
    else:  # SSM or compressed state cannot be cut: no reuse rather than a wrong one
        assert (cache, n) == (None, 0)


def test_a_chunked_cache_is_cut_back_only_to_a_chunk_it_holds_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = make_tiny_model(tmp_path_factory.mktemp("llama4") / "m", model_type="llama4", layers=4)
    model: Any = mlx_lm.load(str(path))[0]
    chunk = model.language_model.model.attention_chunk_size
    tokens = [(7 * i) % 300 + 20 for i in range(4 * chunk)]
    # A prompt then token by token, as a request decodes: the chunked layers drop their
    # oldest keys, holding the last `chunk` only.
    stored = 2 * chunk + chunk // 2
    _, cache = _fill(model, tokens[: 2 * chunk])
    for i in range(2 * chunk, stored):
        _fill(model, tokens[i : i + 1], cache)
    kept = cache[0].start_position
    assert kept > chunk  # the first chunk is gone, and part of the second
    shortest = shortest_cut(cache, stored)
    assert shortest == 2 * chunk  # the start of the chunk it holds from its first key
    prefix = PrefixCache(64 << 20, min_tokens=1)
    prefix.store(tokens[:stored], cache)
    # A token the prompt never holds, inside the vocabulary (an id past its end would read
    # past the embedding table: garbage logits, NaN in some runs).
    other = model.language_model.model.vocab_size - 1
    assert other not in tokens
    for n in (shortest - 1, shortest, shortest + 1):
        diverging = [*tokens[:n], other, *tokens[n + 1 : stored + 4]]
        hit, got = prefix.lookup(diverging)
        if n < shortest:  # the keys of n's chunk before `kept` are gone: no reuse
            assert (hit, got) == (None, 0)
            continue
        assert got == n and hit is not None
        reused, fresh = _fill(model, diverging[n:], hit)[0], _fill(model, diverging)[0]
        assert mx.allclose(reused, fresh, atol=1e-4).item(), n
