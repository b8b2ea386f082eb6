"""Quantized weights on exo's CPU kernels against the dense fp32 path.

Tiny random models of each GGUF quantization, and SmolLM2: logits agree within 1e-4 of their
largest magnitude (float32 sums in another order), greedy text is identical.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

import exo_mlx_cpu_kernels as kernels
from exo_engine_mlx.blas import dequantize_model
from exo_engine_mlx.cpu_kernels import (
    KernelQuantizedEmbedding,
    KernelQuantizedLinear,
    kernel_ready,
    kernels_requested,
    use_kernels,
)
from exo_engine_mlx.embedded import embedded_gguf_path
from exo_engine_mlx.gguf import import_gguf

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels not built")

MakeGGUF = Callable[..., Path]
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "What is the capital of France?",
    "List three prime numbers and explain why they are prime.",
]


def _both(model_dir: Path) -> tuple[Any, Any, Any]:
    kernel_model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    dense_model = mlx_lm.load(str(model_dir))[0]
    assert kernel_ready(kernel_model)
    assert use_kernels(kernel_model) > 0
    dequantize_model(dense_model)
    return kernel_model, dense_model, tokenizer


@pytest.mark.parametrize(
    ("weight_type", "embd_type", "tied"),
    [("Q4_0", "Q8_0", True), ("Q4_1", "Q4_1", False), ("Q8_0", "Q8_0", True)],
)
def test_tiny_gguf_logits_match_dense(
    tiny_gguf: MakeGGUF, tmp_path: Path, weight_type: str, embd_type: str, tied: bool
) -> None:
    src = tiny_gguf(weight_type=weight_type, embd_type=embd_type, tied=tied)
    kernel_model, dense_model, _ = _both(import_gguf(src, tmp_path / "m", "tiny"))
    kinds = {type(m) for _, m in kernel_model.named_modules()}
    assert KernelQuantizedLinear in kinds and nn.QuantizedLinear not in kinds
    ids = mx.array([[3, 17, 42, 99, 5, 250, 7]])
    for rows in (ids, ids[:, :1]):  # a prefill-sized call and a one-token call
        got, want = np.array(kernel_model(rows)), np.array(dense_model(rows))
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_env_turns_kernels_off() -> None:
    assert kernels_requested({})
    assert not kernels_requested({"EXO_CPU_KERNELS": "off"})
    assert not kernels_requested({"EXO_DENSE": "on"})


def test_unsupported_layers_are_left_alone() -> None:
    layer = nn.QuantizedLinear(64, 32, group_size=32, bits=3)
    model = nn.Sequential(layer)
    assert not kernel_ready(model)
    assert use_kernels(model) == 0 and type(layer) is nn.QuantizedLinear


@pytest.mark.smollm
@pytest.mark.slow
def test_smollm_greedy_text_identical_to_dense(tmp_path: Path) -> None:
    """Greedy tokens of the kernel path are the dense path's argmax at every position."""
    model_dir = import_gguf(embedded_gguf_path(), tmp_path / "smol", "smollm2")
    kernel_model, dense_model, tokenizer = _both(model_dir)
    assert isinstance(kernel_model.model.embed_tokens, KernelQuantizedEmbedding)
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        new = [
            r.token
            for r in mlx_lm.stream_generate(
                kernel_model, tokenizer, ids, max_tokens=24, sampler=make_sampler(0.0)
            )
        ]
        # One dense forward over prompt + generated text: its argmax must be each next token.
        logits = dense_model(mx.array([ids + new[:-1]]))[0, len(ids) - 1 :]
        assert np.array(mx.argmax(logits, axis=-1)).tolist() == new, prompt
