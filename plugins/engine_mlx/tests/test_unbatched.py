"""Families whose caches mlx-lm's batch generator cannot batch (llama4's chunked attention,
deepseek_v41's compressed layer cache) are served one cache per request (`SoloGenerator`),
with the batched path's rules: checked on their tiny models (mlx-lm's own classes, the
engine's loader) against mlx-lm's own single-sequence generation."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import msgspec
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)
from mlx_lm.models.deepseek_v41 import LayerCache

from exo_core.plugin import (
    ChatMessage,
    ErrorChunk,
    FinishReason,
    GenerationParams,
    KeepAliveChunk,
    SamplingParams,
    TextChunk,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.family_sweep import TinyFamilies
from exo_engine_mlx.generation_solo import batchable
from exo_engine_mlx.loading import load_model
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.testing import ScriptedOutput
from exo_engine_mlx.testing import finish_of as finish
from exo_engine_mlx.testing import run_requests as run
from exo_engine_mlx.testing import text_of as text

UNBATCHABLE_FAMILIES = ["llama4", "deepseek_v41"]
GREEDY = SamplingParams(temperature=0)


def test_batchable_asks_every_cache_type_for_the_merge_the_batch_generator_calls() -> None:
    assert batchable([])
    assert batchable([KVCache(), RotatingKVCache(max_size=8), ArraysCache(2)])
    assert batchable([CacheList(KVCache(), ArraysCache(1))])
    assert not batchable([KVCache(), ChunkedKVCache(8)])
    assert not batchable([CacheList(KVCache(), ChunkedKVCache(8))])
    assert not batchable([LayerCache(window_size=8)])


def params(text: str, **kw: Any) -> GenerationParams:
    kw.setdefault("sampling", GREEDY)
    kw.setdefault("max_tokens", 8)
    return GenerationParams(messages=(ChatMessage(role="user", content=text),), **kw)


@pytest.fixture(scope="module", params=UNBATCHABLE_FAMILIES)
def loaded(request: pytest.FixtureRequest, tiny_families: TinyFamilies) -> tuple[Any, Any]:
    return load_model(str(tiny_families.path(request.param)))


def test_the_engine_picks_one_cache_per_request(loaded: tuple[Any, Any]) -> None:
    assert not batchable(make_prompt_cache(loaded[0]))
    assert not BatchEngine(*loaded).batched


def test_one_request_gives_mlx_lms_own_greedy_tokens(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    got = run(BatchEngine(model, tokenizer), {"t": params("hello world", max_tokens=8)})["t"]
    assert finish(got).finish_reason == FinishReason.LENGTH
    assert finish(got).usage.completion_tokens == 8
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello world"}], add_generation_prompt=True, tokenize=False
    )
    prompt = mx.array(tokenizer.encode(rendered, add_special_tokens=False))
    tokens = [t for t, _ in generate_step(prompt, model, max_tokens=8)]
    assert text(got) == tokenizer.decode(tokens)


def test_two_concurrent_requests_each_answer_as_alone(loaded: tuple[Any, Any]) -> None:
    sampled = SamplingParams(temperature=0.9, top_k=20, seed=7)
    requests = {
        "greedy": params("hello world", stop=()),
        "sampled": params(
            "the quick brown fox jumps", sampling=sampled, logprobs=True, top_logprobs=2
        ),
    }
    alone = {k: run(BatchEngine(*loaded), {k: p})[k] for k, p in requests.items()}
    together = run(BatchEngine(*loaded), requests)
    for k in requests:
        assert text(together[k]) == text(alone[k]), k
        assert finish(together[k]).usage.completion_tokens == 8
    logprobs = [lp for c in together["sampled"] if isinstance(c, TextChunk) for lp in c.logprobs]
    assert logprobs and all(len(lp.top) == 2 for lp in logprobs)


def test_a_stop_string_cuts_the_text(loaded: tuple[Any, Any]) -> None:
    whole = text(run(BatchEngine(*loaded), {"t": params("hello world")})["t"])
    stop = whole[2:4]
    got = run(BatchEngine(*loaded), {"t": params("hello world", stop=(stop,))})["t"]
    assert finish(got).finish_reason == FinishReason.STOP
    assert text(got) == whole[: whole.index(stop)]


def test_a_cancelled_request_ends_and_the_other_goes_on(loaded: tuple[Any, Any]) -> None:
    alone = text(run(BatchEngine(*loaded), {"b": params("hello world")})["b"])
    engine = BatchEngine(*loaded)
    out = run(
        engine,
        {"a": params("numbers like 12345", max_tokens=200), "b": params("hello world")},
        cancel_after=3,
    )
    assert finish(out["a"]).finish_reason == FinishReason.CANCELLED
    assert text(out["b"]) == alone
    assert engine.active == 0


def test_a_bad_sampling_value_fails_its_request_alone(loaded: tuple[Any, Any]) -> None:
    alone = text(run(BatchEngine(*loaded), {"good": params("hello world")})["good"])
    engine = BatchEngine(*loaded)
    bad = SamplingParams(temperature=0.7, top_k=10**6)  # the core refuses it; if one got here
    out = run(engine, {"good": params("hello world"), "bad": params("tiny model", sampling=bad)})
    assert isinstance(out["bad"][-1], ErrorChunk)
    assert text(out["good"]) == alone
    assert text(run(engine, {"after": params("hello world")})["after"]) == alone


def test_a_long_prompt_is_prefilled_a_chunk_a_step(loaded: tuple[Any, Any]) -> None:
    prompt = "the quick brown fox jumps over the lazy dog " * 3
    stepped = run(BatchEngine(*loaded, prefill_step_size=8), {"t": params(prompt)})["t"]
    done = [c.prefill_processed for c in stepped if isinstance(c, KeepAliveChunk)]
    assert len(done) >= 3 and done[0] == 8 and done == sorted(done)
    whole = run(BatchEngine(*loaded), {"t": params(prompt)})["t"]
    assert text(stepped) == text(whole)


class _Counted:
    """The model, counting the tokens run through it (prefill and decode steps alike)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.tokens = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        self.tokens += inputs.shape[1]
        return self.model(inputs, cache=cache)


class _Scripted(ScriptedOutput):
    """A scripted answer on the model's own cache types (llama4's and deepseek_v41's)."""

    def make_cache(self) -> list[Any]:
        return self._model.make_cache()


LONG = "the quick brown fox jumps over the lazy dog and hello world numbers like 12345"
ANSWER = "hello world"


def _next_turn(answer: str) -> GenerationParams:
    return GenerationParams(
        messages=(
            ChatMessage(role="user", content=LONG),
            ChatMessage(role="assistant", content=answer),
            ChatMessage(role="user", content="and more"),
        ),
        sampling=GREEDY,
        max_tokens=8,
    )


def test_the_next_turn_is_prefilled_from_the_stored_conversation(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    cache = PrefixCache(budget_bytes=64 << 20, min_tokens=4)
    # The first turn's answer is scripted (ended by end-of-sequence), so that the next turn's
    # prompt holds the very tokens the first request left in its cache: a random model's
    # answer need not come back as the same tokens when the template encodes it again.
    prompt = finish(run(BatchEngine(*loaded), {"n": params(LONG, count_only=True)})["n"])
    answer = [*tokenizer.encode(ANSWER, add_special_tokens=False), *tokenizer.eos_token_ids]
    scripted = _Scripted(model, prompt.usage.prompt_tokens, answer)
    first = run(BatchEngine(scripted, tokenizer, prefix_cache=cache), {"a": params(LONG)})["a"]
    assert text(first) == ANSWER and len(cache) == 1

    counted = _Counted(model)
    engine = BatchEngine(counted, tokenizer, prefix_cache=cache)
    reused = run(engine, {"t": _next_turn(ANSWER)})["t"]
    fresh = run(BatchEngine(*loaded), {"t": _next_turn(ANSWER)})["t"]
    usage = finish(reused).usage
    # The whole first request is reused: its prompt and its answer.
    assert usage.cached_tokens == prompt.usage.prompt_tokens + len(answer)
    assert usage.prompt_tokens == finish(fresh).usage.prompt_tokens
    # Only the rest of the prompt went through the model, then one step per token.
    assert counted.tokens == usage.prompt_tokens - usage.cached_tokens + usage.completion_tokens
    assert text(reused) == text(fresh)
    # The entry served a copy: it serves the same turn again.
    again = run(engine, {"t": _next_turn(ANSWER)})["t"]
    assert finish(again).usage.cached_tokens == usage.cached_tokens
    assert text(again) == text(fresh)


def test_a_prompt_that_leaves_the_stored_one_early_is_not_served_from_it(
    loaded: tuple[Any, Any],
) -> None:
    # The stored request's cache cannot be cut back to the shared part (see above): prefilling
    # it afresh, not a cache holding positions the new prompt does not have.
    cache = PrefixCache(budget_bytes=64 << 20, min_tokens=2)
    engine = BatchEngine(*loaded, prefix_cache=cache)
    run(engine, {"a": params(LONG)})
    other = params(LONG.replace("numbers", "letters"))
    fresh = run(BatchEngine(*loaded), {"b": other})["b"]
    got = run(engine, {"b": other})["b"]
    assert finish(got).usage.cached_tokens == 0
    assert text(got) == text(fresh)


def test_a_request_that_opts_out_neither_stores_nor_reuses(loaded: tuple[Any, Any]) -> None:
    cache = PrefixCache(budget_bytes=64 << 20, min_tokens=2)
    engine = BatchEngine(*loaded, prefix_cache=cache)
    run(engine, {"a": params(LONG, prefix_cache=False)})
    assert len(cache) == 0
    answer = text(run(engine, {"a": params(LONG)})["a"])
    assert len(cache) == 1
    turn = msgspec.structs.replace(_next_turn(answer), prefix_cache=False)
    assert finish(run(engine, {"t": turn})["t"]).usage.cached_tokens == 0


def test_the_solo_path_on_a_batchable_model_gives_the_batched_tokens(
    tiny_families: TinyFamilies,
) -> None:
    loaded = load_model(str(tiny_families.path("llama")))
    requests = {"a": params("hello world"), "b": params("the quick brown fox jumps")}
    batched = run(BatchEngine(*loaded), requests)
    solo = run(BatchEngine(*loaded, batched=False), requests)
    assert {k: text(v) for k, v in solo.items()} == {k: text(v) for k, v in batched.items()}
