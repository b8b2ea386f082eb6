"""Continuous batching on a tiny random model, checked against mlx-lm's own generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    KeepAliveChunk,
    SamplingParams,
    TaskId,
    TextChunk,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.generation_solo import has_recurrent_state
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.testing import finish_of as finish
from exo_engine_mlx.testing import run_requests as run
from exo_engine_mlx.testing import text_of as text
from exo_engine_mlx.textstream import TextStream
from exo_engine_mlx.tiny_model import make_tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPTS = [
    "hello world",
    "the quick brown fox",
    "numbers like 12345",
    "def main():",
    "emoji 🙂 and 東京",
    "tiny model",
    "lazy dog jumps",
    "this is a test",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[Any, Any]:
    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    return model, tokenizer


def params(text: str, **kw: Any) -> GenerationParams:
    kw.setdefault("sampling", GREEDY)
    kw.setdefault("max_tokens", 16)
    return GenerationParams(messages=(ChatMessage(role="user", content=text),), **kw)


def reference(loaded: tuple[Any, Any], prompt: str, max_tokens: int = 16) -> str:
    model, tokenizer = loaded
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return mlx_lm.generate(model, tokenizer, rendered, max_tokens=max_tokens, verbose=False)


def test_greedy_equals_mlx_lm(loaded: tuple[Any, Any]) -> None:
    engine = BatchEngine(*loaded)
    for prompt in PROMPTS[:3]:
        got = run(engine, {"t": params(prompt)})["t"]
        assert text(got) == reference(loaded, prompt)
        assert finish(got).usage.prompt_tokens > 0


def test_eight_concurrent_requests_each_equal_their_solo_run(loaded: tuple[Any, Any]) -> None:
    assert not has_recurrent_state(loaded[0])  # its prompts are prefilled together
    solo = {p: text(run(BatchEngine(*loaded), {"t": params(p)})["t"]) for p in PROMPTS}
    engine = BatchEngine(*loaded, max_concurrent=8)
    together = run(engine, {f"t{i}": params(p) for i, p in enumerate(PROMPTS)})
    for i, p in enumerate(PROMPTS):
        assert text(together[f"t{i}"]) == solo[p], p


def test_a_request_joining_mid_batch_disturbs_nobody(loaded: tuple[Any, Any]) -> None:
    solo = {p: text(run(BatchEngine(*loaded), {"t": params(p)})["t"]) for p in PROMPTS[:2]}
    engine = BatchEngine(*loaded)
    out: dict[str, list[Chunk]] = {"a": [], "b": []}
    engine.submit(TaskId("a"), params(PROMPTS[0]))
    for _ in range(5):
        for c in engine.step():
            out[c.task_id].append(c)
    engine.submit(TaskId("b"), params(PROMPTS[1]))
    while engine.active:
        for c in engine.step():
            out[c.task_id].append(c)
    assert text(out["a"]) == solo[PROMPTS[0]]
    assert text(out["b"]) == solo[PROMPTS[1]]


def test_a_recurrent_state_model_answers_in_a_batch_as_alone(tmp_path: Path) -> None:
    # Nemotron-H's mamba blocks run over a left-padded prompt's padding: prefilled together with
    # a longer prompt, the shorter one's greedy answer changed. Its prompts are prefilled alone.
    loaded = mlx_lm.load(str(make_tiny_model(tmp_path / "m", model_type="nemotron_h", layers=4)))
    model, tokenizer = loaded[:2]
    assert has_recurrent_state(model)
    short, long = "hello world", "the quick brown fox jumps over the lazy dog"
    solo = [text(run(BatchEngine(model, tokenizer), {"t": params(p)})["t"]) for p in (short, long)]
    together = run(BatchEngine(model, tokenizer), {"a": params(short), "b": params(long)})
    assert [text(together["a"]), text(together["b"])] == solo


def test_max_tokens_and_usage(loaded: tuple[Any, Any]) -> None:
    got = run(BatchEngine(*loaded), {"t": params("hello world", max_tokens=3)})["t"]
    f = finish(got)
    assert f.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert f.usage.completion_tokens <= 3
    assert f.usage.time_to_first_token_s >= 0 and f.usage.generation_tps >= 0


def test_stop_sequence_cuts_the_text(loaded: tuple[Any, Any]) -> None:
    full = text(run(BatchEngine(*loaded), {"t": params("hello world", max_tokens=30)})["t"])
    assert len(full) > 4
    stop = full[3:5]
    got = run(BatchEngine(*loaded), {"t": params("hello world", max_tokens=30, stop=(stop,))})["t"]
    assert text(got) == full[: full.index(stop)]
    assert finish(got).finish_reason == FinishReason.STOP


def test_logprobs_and_top_logprobs(loaded: tuple[Any, Any]) -> None:
    got = run(
        BatchEngine(*loaded),
        {"t": params("hello world", max_tokens=4, logprobs=True, top_logprobs=3)},
    )["t"]
    lps = [lp for c in got if isinstance(c, TextChunk) for lp in c.logprobs]
    assert lps, "logprobs were asked for"
    for lp in lps:
        assert lp.logprob <= 0 and len(lp.top) == 3
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert lp.logprob == pytest.approx(lp.top[0].logprob)


def test_repetition_penalty_without_context_size_works(loaded: tuple[Any, Any]) -> None:
    sampling = SamplingParams(temperature=0, repetition_penalty=1.3)
    got = run(BatchEngine(*loaded), {"t": params("hello world", sampling=sampling)})["t"]
    assert isinstance(got[-1], FinishChunk)


def test_seeded_sampling_is_reproducible(loaded: tuple[Any, Any]) -> None:
    sampling = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, seed=1234)
    first = text(run(BatchEngine(*loaded), {"t": params("hello world", sampling=sampling)})["t"])
    mx.random.seed(99)  # global randomness must not matter
    engine = BatchEngine(*loaded)
    both = run(
        engine,
        {
            "t": params("hello world", sampling=sampling),
            "u": params("tiny model", sampling=sampling),
        },
    )
    assert text(both["t"]) == first


def test_cancel_frees_the_slot(loaded: tuple[Any, Any]) -> None:
    engine = BatchEngine(*loaded)
    engine.submit(TaskId("a"), params("hello world", max_tokens=200))
    engine.step()
    engine.step()
    chunks = engine.cancel(TaskId("a"))
    assert finish(chunks).finish_reason == FinishReason.CANCELLED
    assert engine.active == 0
    assert engine.cancel(TaskId("a")) == []  # twice is harmless


def test_prefix_cache_reuses_a_shared_prefix(loaded: tuple[Any, Any]) -> None:
    cache = PrefixCache(budget_bytes=64 << 20, min_tokens=4)
    engine = BatchEngine(*loaded, prefix_cache=cache)
    first = run(engine, {"t": params("hello world")})["t"]
    assert finish(first).usage.cached_tokens == 0
    again = run(engine, {"t": params("hello world")})["t"]
    assert finish(again).usage.cached_tokens == finish(first).usage.prompt_tokens - 1
    assert text(again) == text(first)
    # A second turn of the same chat shares the first turn's prefix.
    turn = GenerationParams(
        messages=(
            ChatMessage(role="user", content="hello world"),
            ChatMessage(role="assistant", content=text(first)),
            ChatMessage(role="user", content="and more"),
        ),
        sampling=GREEDY,
        max_tokens=8,
    )
    uncached = run(BatchEngine(*loaded), {"t": turn})["t"]
    cached = run(engine, {"t": turn})["t"]
    assert finish(cached).usage.cached_tokens > 5
    assert text(cached) == text(uncached)


def test_prefix_cache_evicts_least_recently_used(loaded: tuple[Any, Any]) -> None:
    # min_tokens above the chat template's shared opening, so only real prefixes hit.
    cache = PrefixCache(budget_bytes=64 << 20, min_tokens=8)
    engine = BatchEngine(*loaded, prefix_cache=cache)
    run(engine, {"t": params("hello world")})
    one = cache.nbytes
    cache.budget_bytes = int(one * 2.5)
    run(engine, {"t": params("the quick brown fox")})
    run(engine, {"t": params("numbers like 12345")})
    assert len(cache) == 2 and cache.nbytes <= cache.budget_bytes
    hit = run(engine, {"t": params("hello world")})["t"]
    assert finish(hit).usage.cached_tokens == 0, "the oldest entry was evicted"


def test_template_refusal_is_an_error_chunk(loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    original = tokenizer.chat_template
    tokenizer.chat_template = "{{ raise_exception('no tools here') }}"
    try:
        got = BatchEngine(*loaded).submit(TaskId("t"), params("hi"))
    finally:
        tokenizer.chat_template = original
    assert isinstance(got[0], ErrorChunk) and "template" in got[0].message


def test_split_characters_never_come_out_as_replacement(loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    sample = "new: 🦊🎉 한국어 ünï 東京"  # characters the tiny vocab never merged
    ids = tokenizer.encode(sample, add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the sample must split a character across tokens"
    stream = TextStream(tokenizer.detokenizer, stops=())
    emitted = [stream.add(i) for i in ids] + [stream.finish()]
    assert all("\ufffd" not in e for e in emitted)
    assert "".join(emitted) == sample


def test_stop_string_split_across_tokens(loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    sample = "the quick brown fox jumps"
    stream = TextStream(tokenizer.detokenizer, stops=("brown f",))
    emitted = "".join(stream.add(i) for i in tokenizer.encode(sample, add_special_tokens=False))
    emitted += stream.finish()
    assert emitted == "the quick " and stream.stopped


def test_a_long_prompt_reports_prefill_progress_step_by_step(loaded: tuple[Any, Any]) -> None:
    model, tokenizer = loaded
    prompt = " ".join(PROMPTS * 3)
    stepped = BatchEngine(model, tokenizer, prefill_step_size=8)
    chunks = run(stepped, {"t": params(prompt, max_tokens=4)})["t"]
    progress = [c for c in chunks if isinstance(c, KeepAliveChunk)]
    assert len(progress) >= 3
    total = progress[0].prefill_total
    assert total > 24 and all(c.prefill_total == total for c in progress)
    done = [c.prefill_processed for c in progress]
    assert done == sorted(done) and done[0] == 8 and done[-1] < total
    # Stepping the prefill changes nothing in the answer.
    whole = run(BatchEngine(model, tokenizer), {"t": params(prompt, max_tokens=4)})["t"]
    assert text(chunks) == text(whole)
    assert not any(isinstance(c, KeepAliveChunk) for c in whole)


# -- one request's failure stays its own ---------------------------------------------------------

# Values the core refuses; if one still got here, only its own request may fail.
UNCHECKED_BAD = {
    "negative seed": SamplingParams(temperature=0.7, seed=-1),
    "top_k beyond the vocabulary": SamplingParams(temperature=0.7, top_k=10**6),
    "negative repetition penalty": SamplingParams(temperature=0, repetition_penalty=-1.0),
}


@pytest.mark.parametrize("bad", list(UNCHECKED_BAD), ids=list(UNCHECKED_BAD))
def test_a_failing_request_fails_alone(loaded: tuple[Any, Any], bad: str) -> None:
    solo = text(run(BatchEngine(*loaded), {"t": params(PROMPTS[0])})["t"])
    engine = BatchEngine(*loaded)
    out = run(
        engine, {"good": params(PROMPTS[0]), "bad": params(PROMPTS[1], sampling=UNCHECKED_BAD[bad])}
    )
    failed = out["bad"][-1]
    assert isinstance(failed, ErrorChunk)
    assert "see the node's log" in failed.message and "Error" not in failed.message
    assert text(out["good"]) == solo
    assert finish(out["good"]).finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert text(run(engine, {"after": params(PROMPTS[0])})["after"]) == solo
    # and it left nothing behind for requests that sample at random (MLX's global key)
    sampled = run(engine, {"later": params(PROMPTS[0], sampling=SamplingParams(temperature=0.7))})
    assert isinstance(sampled["later"][-1], FinishChunk), sampled["later"][-1]


def test_a_failed_step_ends_its_batch_and_the_engine_goes_on(
    loaded: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    solo = text(run(BatchEngine(*loaded), {"t": params(PROMPTS[0])})["t"])
    engine = BatchEngine(*loaded)
    engine.submit(TaskId("a"), params(PROMPTS[0]))
    engine.submit(TaskId("b"), params(PROMPTS[1]))

    def broken() -> None:
        raise RuntimeError("the step broke")

    monkeypatch.setattr(engine._generator, "next", broken)
    chunks = engine.step()
    assert sorted(c.task_id for c in chunks) == ["a", "b"]
    assert all(isinstance(c, ErrorChunk) for c in chunks)
    assert engine.active == 0
    assert text(run(engine, {"after": params(PROMPTS[0])})["after"]) == solo


def test_max_tokens_is_capped_by_the_context(loaded: tuple[Any, Any]) -> None:
    probe = run(BatchEngine(*loaded), {"t": params(PROMPTS[0], max_tokens=1)})["t"]
    prompt = finish(probe).usage.prompt_tokens
    engine = BatchEngine(*loaded, context_length=prompt + 3)
    got = run(engine, {"t": params(PROMPTS[0], max_tokens=50)})["t"]
    assert finish(got).usage.completion_tokens <= 3
    refused = run(BatchEngine(*loaded, context_length=prompt), {"t": params(PROMPTS[0])})["t"]
    assert isinstance(refused[-1], ErrorChunk) and "context" in refused[-1].message


def _steps_to_first_token(
    engine: BatchEngine, task: str, asked: GenerationParams
) -> list[list[Chunk]]:
    """Submit `task`, step until its first token; returns the chunks, one list per step."""
    engine.submit(TaskId(task), asked)
    steps: list[list[Chunk]] = []
    while engine.generated(TaskId(task)) == 0:
        steps.append(engine.step())
    return steps


def test_the_first_token_comes_in_the_step_that_ends_the_prompt(loaded: tuple[Any, Any]) -> None:
    """mlx-lm hands a sequence's first token out a step after computing it, once the next
    token's forward is built and run; the engine hands it out at once (a step earlier), with
    the same text, logprobs and finish, for a fresh prompt and a cached one."""
    asked = params(PROMPTS[0], ignore_eos=True, logprobs=True, top_logprobs=2)
    expected = run(BatchEngine(*loaded, early_first_token=False), {"t": asked})["t"]
    for cached in (False, True):
        engines = {
            early: BatchEngine(
                *loaded, prefix_cache=PrefixCache(1 << 26, 1), early_first_token=early
            )
            for early in (False, True)
        }
        steps = {}
        for early, engine in engines.items():
            if cached:
                run(engine, {"warm": asked})
            steps[early] = len(_steps_to_first_token(engine, "t", asked))
            got: list[Chunk] = []
            while engine.active:
                got += engine.step()
            assert (finish(got).usage.cached_tokens > 0) == cached
        assert steps[True] == steps[False] - 1, (cached, steps)
    engine = BatchEngine(*loaded)
    first = [c for step in _steps_to_first_token(engine, "t", asked) for c in step]
    rest: list[Chunk] = []
    while engine.active:
        rest += engine.step()
    got = first + rest
    assert text(got) == text(expected)
    assert finish(got).finish_reason == finish(expected).finish_reason
    assert finish(got).usage.completion_tokens == finish(expected).usage.completion_tokens
    assert [c.logprobs for c in got if isinstance(c, TextChunk)] == [
        c.logprobs for c in expected if isinstance(c, TextChunk)
    ]
    one = run(BatchEngine(*loaded), {"t": params(PROMPTS[0], max_tokens=1, ignore_eos=True)})
    assert finish(one["t"]).usage.completion_tokens == 1
