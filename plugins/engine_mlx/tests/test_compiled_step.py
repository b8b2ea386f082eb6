"""The compiled one-token step gives the uncompiled step's logits and greedy text.

The same loaded model runs both ways (its blocks switch class back and forth), on a tiny random
llama (dense and, where the kernels are built, quantized on exo's kernels), through a plain KV
cache and through the runner's continuous batching (left-padded batch caches, array offsets),
and on SmolLM2 as the runner loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx.nn.layers.distributed import shard_linear
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache

import exo_mlx_cpu_kernels as kernels
from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.compiled_step import (
    CompiledTransformerBlock,
    compile_decode_step,
    compile_requested,
    folds_row_work,
    fused_projections,
    row_work_requested,
)
from exo_engine_mlx.cpu_kernels import use_kernels
from exo_engine_mlx.tiny_model import make_tiny_model

PROMPTS = ["hello world", "the quick brown fox jumps over", "numbers like 12345 and more"]


@contextmanager
def uncompiled(model: nn.Module) -> Iterator[None]:
    blocks: list[Any] = [
        m for _, m in model.named_modules() if isinstance(m, CompiledTransformerBlock)
    ]
    assert blocks, "nothing was compiled"
    for m in blocks:
        m.__class__ = llama.TransformerBlock
    try:
        yield
    finally:
        for m in blocks:
            m.__class__ = CompiledTransformerBlock


def greedy_steps(model: nn.Module, prompt: list[int], steps: int) -> list[mx.array]:
    """Logits of `steps` one-token steps after a prefill, feeding back the argmax."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    out = []
    for _ in range(steps):
        logits = model(mx.argmax(logits, axis=-1)[:, None], cache=cache)[:, -1]
        mx.eval(logits)
        out.append(logits)
    return out


def batch_texts(
    model: nn.Module, tokenizer: Any, max_tokens: int, prompts: list[str] = PROMPTS
) -> list[str]:
    engine = BatchEngine(model, tokenizer, max_concurrent=len(prompts))
    out: dict[str, str] = {str(i): "" for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        params = GenerationParams(
            messages=(ChatMessage(role="user", content=prompt),),
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=0),
        )
        assert engine.submit(TaskId(str(i)), params) == []
    while engine.active:
        for c in engine.step():
            if isinstance(c, TextChunk):
                out[c.task_id] += c.text
    return list(out.values())


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", layers=3)


@pytest.mark.parametrize("weights", ["dense", "kernels"])
def test_one_token_steps_match_uncompiled(tiny_dir: Path, weights: str) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_dir))[:2]
    if weights == "kernels":
        if not kernels.available():
            pytest.skip("kernels not built")
        nn.quantize(model, group_size=32, bits=4)
        assert use_kernels(model) > 0
    assert compile_decode_step(model) == 3
    # On the kernels q/k/v and gate/up run as one call each (bit for bit the same outputs).
    fused = [len(fused_projections(b)) for b in model.model.layers]
    assert fused == ([2, 2, 2] if weights == "kernels" else [0, 0, 0])
    # On the kernels a decode step also folds norms, rotary, SwiGLU and residuals into them.
    folded = [folds_row_work(b) for b in model.model.layers]
    assert folded == [weights == "kernels"] * 3
    prompt = tokenizer.encode("the quick brown fox")
    compiled = greedy_steps(model, prompt, 6)
    with uncompiled(model):
        plain = greedy_steps(model, prompt, 6)
    for got, want in zip(compiled, plain, strict=True):
        scale = float(np.abs(np.array(want)).max())
        assert mx.allclose(got, want, rtol=1e-5, atol=1e-5 * scale)
    # Continuous batching: three prompts of different lengths, left-padded, stepped together
    # (folded: each row rotated by its own offset).
    together = batch_texts(model, tokenizer, 12)
    with uncompiled(model):
        assert batch_texts(model, tokenizer, 12) == together
    assert all(together)
    # One stream through the runner's batch cache (an array offset): the one-row graph.
    alone = batch_texts(model, tokenizer, 12, PROMPTS[1:2])
    with uncompiled(model):
        assert batch_texts(model, tokenizer, 12, PROMPTS[1:2]) == alone


def test_tensor_sharded_blocks_stay_uncompiled(tiny_dir: Path) -> None:
    model: Any = mlx_lm.load(str(tiny_dir))[0]
    group = mx.distributed.init()
    block = model.model.layers[0]
    block.self_attn.o_proj = shard_linear(block.self_attn.o_proj, "sharded-to-all", group=group)
    assert compile_decode_step(model) == 2
    assert type(block) is llama.TransformerBlock


def test_env_switch() -> None:
    assert compile_requested({})
    assert compile_requested({"EXO_COMPILE_STEP": "auto"})
    assert not compile_requested({"EXO_COMPILE_STEP": "off"})
    assert not compile_requested({"EXO_COMPILE_STEP": " OFF "})
    assert row_work_requested({})
    assert not row_work_requested({"EXO_FUSE_ROW_WORK": "off"})


@pytest.mark.smollm
@pytest.mark.slow
def test_smollm_greedy_text_identical_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2 loaded as the runner loads it (kernels when built): batched greedy text of the
    compiled step equals the uncompiled step's."""
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.loading import load_model

    monkeypatch.delenv("EXO_COMPILE_STEP", raising=False)
    # The compiled step's folded norms round differently: token for token on float only.
    monkeypatch.setenv("EXO_CPU_KERNELS", "float")
    model, tokenizer = load_model(str(ensure_embedded_model(tmp_path)))
    assert isinstance(model.model.layers[0], CompiledTransformerBlock)
    compiled = batch_texts(model, tokenizer, 16)
    with uncompiled(model):
        assert batch_texts(model, tokenizer, 16) == compiled
    assert all(compiled)
