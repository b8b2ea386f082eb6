"""Chunked prefill: a long prompt is read a chunk a step while running streams keep decoding.

On a tiny random model (not timed): the running stream's tokens are counted between the long
prompt's chunks; chunking changes no greedy token; the prefix cache still hits after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx_lm
import pytest

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    FinishChunk,
    GenerationParams,
    KeepAliveChunk,
    SamplingParams,
    TaskId,
    TextChunk,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.engine import options_from_env
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.protocol import PREFILL_CHUNK
from exo_engine_mlx.testing import finish_of, run_requests, text_of
from exo_engine_mlx.tiny_model import make_tiny_model

# ~1,200 tokens on the tiny model's tokenizer: several default chunks.
LONG = " ".join(f"the quick brown fox {i} jumps over the lazy dog" for i in range(90))
RUNNING = "hello world"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model_dir: Path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    return model, tokenizer


def params(text: str, **kw: Any) -> GenerationParams:
    kw.setdefault("sampling", SamplingParams(temperature=0))
    return GenerationParams(messages=(ChatMessage(role="user", content=text),), **kw)


def running(max_tokens: int = 300) -> GenerationParams:
    return params(RUNNING, max_tokens=max_tokens, ignore_eos=True)


def interleaved(engine: BatchEngine) -> tuple[list[int], dict[str, list[Chunk]]]:
    """Stream "a" runs; once it has tokens, the long prompt "b" arrives. Returns the tokens a
    generated in each of b's prefill steps, and every chunk of both."""
    a, b = TaskId("a"), TaskId("b")
    out: dict[str, list[Chunk]] = {"a": [], "b": []}

    def step() -> list[Chunk]:
        chunks = engine.step()
        for c in chunks:
            out[c.task_id].append(c)
        return chunks

    out["a"] += engine.submit(a, running())
    while engine.generated(a) < 2:
        step()
    out["b"] += engine.submit(b, params(LONG, max_tokens=4))
    a_per_chunk: list[int] = []
    while not any(isinstance(c, TextChunk | FinishChunk) for c in out["b"]):
        before = engine.generated(a)
        if any(isinstance(c, KeepAliveChunk) and c.task_id == b for c in step()):
            a_per_chunk.append(engine.generated(a) - before)
    while engine.active:
        step()
    return a_per_chunk, out


def test_a_running_stream_keeps_decoding_while_a_long_prompt_is_read(
    loaded: tuple[Any, Any],
) -> None:
    engine = BatchEngine(*loaded)  # the default chunk
    assert len(loaded[1].encode(LONG)) > 1000
    a_per_chunk, out = interleaved(engine)
    # The long prompt is read over several steps, not one, and the running stream gets a token
    # in each of them: it never waits for more than one chunk.
    assert len(a_per_chunk) >= 1000 // PREFILL_CHUNK
    assert a_per_chunk == [1] * len(a_per_chunk)
    assert isinstance(out["a"][-1], FinishChunk) and isinstance(out["b"][-1], FinishChunk)


def test_chunking_changes_no_greedy_token(loaded: tuple[Any, Any]) -> None:
    _, out = interleaved(BatchEngine(*loaded, prefill_step_size=32))
    alone_a = run_requests(BatchEngine(*loaded), {"a": running()})["a"]
    whole_b = run_requests(
        BatchEngine(*loaded, prefill_step_size=4096), {"b": params(LONG, max_tokens=4)}
    )["b"]
    assert not any(isinstance(c, KeepAliveChunk) for c in whole_b)  # read in one step
    assert text_of(out["a"]) == text_of(alone_a)
    assert text_of(out["b"]) == text_of(whole_b)


def test_the_prefix_cache_hits_after_a_chunked_prefill(loaded: tuple[Any, Any]) -> None:
    engine = BatchEngine(*loaded, prefill_step_size=32, prefix_cache=PrefixCache(64 * 2**20))
    request = {"b": params(LONG, max_tokens=4)}
    first = run_requests(engine, request)["b"]
    assert any(isinstance(c, KeepAliveChunk) for c in first)  # chunked
    again = run_requests(engine, request)["b"]
    usage = finish_of(again).usage
    assert usage.cached_tokens >= usage.prompt_tokens - 1  # the whole prompt was found
    assert text_of(again) == text_of(first)


def test_the_chunk_setting() -> None:
    assert options_from_env({}).prefill_step_size == PREFILL_CHUNK
    assert options_from_env({"EXO_PREFILL_CHUNK": "64"}).prefill_step_size == 64
    assert options_from_env({"EXO_PREFILL_STEP_SIZE": "96"}).prefill_step_size == 96
    assert options_from_env({"EXO_PREFILL_CHUNK": "0"}).prefill_step_size == 1
