"""The batched decode step's cheaper pieces: grouped-head attention, the shared greedy sampler
(no vocabulary-wide normalisation), and the prefill BLAS threads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.generate import BatchGenerator

import exo_mlx_cpu_kernels as kernels
from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
from exo_core.plugin.engine import runner_env
from exo_engine_mlx.attention import decode_attention, fused_attention_requested
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.generation_batch import ExoGenerationBatch
from exo_engine_mlx.prefill_threads import requested
from exo_engine_mlx.tiny_model import make_tiny_model

PROMPTS = ["hello world", "the quick brown fox", "numbers like 12345", "def main():"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model, tokenizer = mlx_lm.load(str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m")))[:2]
    return model, tokenizer


def params(text: str, **kw: Any) -> GenerationParams:
    kw.setdefault("sampling", SamplingParams(temperature=0))
    kw.setdefault("max_tokens", 12)
    return GenerationParams(messages=(ChatMessage(role="user", content=text),), **kw)


def run(engine: BatchEngine, requests: dict[str, GenerationParams]) -> dict[str, list[TextChunk]]:
    out: dict[str, list[TextChunk]] = {k: [] for k in requests}
    for task_id, p in requests.items():
        engine.submit(TaskId(task_id), p)
    while engine.active:
        for c in engine.step():
            if isinstance(c, TextChunk):
                out[c.task_id].append(c)
    return out


def text(chunks: list[TextChunk]) -> str:
    return "".join(c.text for c in chunks)


@pytest.mark.parametrize(
    ("batch", "heads", "kv_heads", "keys", "dim"),
    [(1, 9, 3, 40, 64), (8, 9, 3, 160, 64), (3, 32, 8, 77, 64), (2, 4, 4, 10, 32)],
)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("fused", ["auto", "off"])
def test_decode_attention_equals_mlx(
    batch: int,
    heads: int,
    kv_heads: int,
    keys: int,
    dim: int,
    mask_kind: str,
    fused: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EXO_FUSED_ATTENTION", fused)
    mx.random.seed(batch * heads + keys)
    q = mx.random.normal((batch, heads, 1, dim))
    # Keys and values as a cache holds them: a slice of a longer buffer.
    k = mx.random.normal((batch, kv_heads, 256, dim))[..., :keys, :]
    v = mx.random.normal((batch, kv_heads, 256, dim))[..., :keys, :]
    left = mx.random.randint(0, keys // 2, (batch,))
    allowed = left[:, None, None, None] <= mx.arange(keys)[None, None, None, :]
    mask = {"none": None, "bool": allowed, "additive": mx.where(allowed, 0.0, -1e9)}[mask_kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=dim**-0.5, mask=mask)
    got = decode_attention(q, k, v, scale=dim**-0.5, mask=mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, rtol=1e-5, atol=1e-6).item()
    if fused == "auto" and kernels.available() and heads != kv_heads:  # the kernel's primitive
        kernel = kernels.decode_attention(q, k, v, dim**-0.5, mask)
        assert np.array_equal(np.array(got), np.array(kernel))


def test_fused_attention_setting() -> None:
    assert fused_attention_requested({})
    assert fused_attention_requested({"EXO_FUSED_ATTENTION": "auto"})
    assert not fused_attention_requested({"EXO_FUSED_ATTENTION": " Off "})


def test_greedy_batch_skips_the_normalisation_and_keeps_the_text(
    loaded: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    solo = {p: text(run(BatchEngine(*loaded), {"t": params(p)})["t"]) for p in PROMPTS}
    calls = 0
    logsumexp = mx.logsumexp

    def counted(*args: Any, **kw: Any) -> mx.array:
        nonlocal calls
        calls += 1
        return logsumexp(*args, **kw)

    monkeypatch.setattr(mx, "logsumexp", counted)
    engine = BatchEngine(*loaded, max_concurrent=4)
    generator = engine._generator
    assert isinstance(generator, BatchGenerator)  # 4 slots: not the one-stream generator
    assert isinstance(generator._generation_batch, ExoGenerationBatch)
    together = run(engine, {p: params(p) for p in PROMPTS})
    assert {p: text(c) for p, c in together.items()} == solo
    # Only a sequence's first token (mlx-lm's own step, when it joins the batch) normalises:
    # 4 prompts prefilled together = 1 call, not one per token.
    assert calls <= 2, calls


def test_logprobs_in_a_greedy_batch_equal_their_solo_run(loaded: tuple[Any, Any]) -> None:
    asks = params(PROMPTS[0], logprobs=True, top_logprobs=2)
    solo = run(BatchEngine(*loaded), {"t": asks})["t"]
    mixed = run(BatchEngine(*loaded), {"t": asks, **{p: params(p) for p in PROMPTS[1:]}})["t"]
    assert text(mixed) == text(solo)
    want = [(lp.token, lp.logprob) for c in solo for lp in c.logprobs]
    got = [(lp.token, lp.logprob) for c in mixed for lp in c.logprobs]
    assert len(got) == len(want) > 0
    for (token, value), (want_token, want_value) in zip(got, want, strict=True):
        assert token == want_token and value == pytest.approx(want_value, abs=1e-4)


def test_prefill_threads_setting() -> None:
    assert requested({}) == requested({"EXO_PREFILL_BLAS_THREADS": "auto"})  # the default
    assert requested({"EXO_PREFILL_BLAS_THREADS": "off"}) is None
    assert requested({"EXO_PREFILL_BLAS_THREADS": "3"}) == 3
    assert (requested({"EXO_PREFILL_BLAS_THREADS": "auto"}) or 0) >= 1


def test_prefill_threads_switch_the_runner_blas(tmp_path: Path) -> None:
    env = runner_env()
    if "EXO_BLAS_ACTIVE" not in env:
        pytest.skip("no fast BLAS to preload on this machine")
    env.update(OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", EXO_PREFILL_BLAS_THREADS="2")
    code = textwrap.dedent(
        """
        from exo_engine_mlx.prefill_threads import for_this_process
        switch = for_this_process()
        assert switch is not None, "the preloaded BLAS was not found"
        before = switch.threads()
        with switch.prefilling():
            during = switch.threads()
        print(before, during, switch.threads())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2", "1"]
