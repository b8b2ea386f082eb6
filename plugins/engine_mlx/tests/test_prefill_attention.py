"""A prompt's attention on exo's tiled kernel (prefill_attention.py), on a tiny random llama.

The kernel must take the prompts (counted), leave one-token steps and what it does not cover to
mlx-lm, and change no greedy token: prompts of different lengths read together (mlx-lm's
boolean batch mask with left padding) and a long prompt read in chunks write the same text as
with EXO_PREFILL_ATTENTION=off, and the logits agree within float32 rounding.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

import exo_mlx_cpu_kernels as kernels
from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams
from exo_engine_mlx import prefill_attention
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.testing import run_requests, text_of
from exo_engine_mlx.tiny_model import make_tiny_model

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels not built")

LONG = " ".join(f"a lantern {i} crosses the copper meadow" for i in range(60))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    model_dir: Path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return tuple(mlx_lm.load(str(model_dir))[:2])  # type: ignore[return-value]


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The wrapper installed; yields a list that counts the kernel's calls. mlx-lm's modules
    get their own function back afterwards."""
    calls: list[int] = []
    kernel = kernels.prefill_attention

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(kernels, "prefill_attention", counted)
    monkeypatch.delenv("EXO_PREFILL_ATTENTION", raising=False)
    assert prefill_attention.install() > 0
    yield calls
    for name, module in list(sys.modules.items()):
        wrapper = getattr(module, "scaled_dot_product_attention", None) if module else None
        if name.startswith("mlx_lm.models") and hasattr(wrapper, "exo_original"):
            module.scaled_dot_product_attention = wrapper.exo_original  # type: ignore[union-attr]


def _params(text: str, tokens: int = 8) -> GenerationParams:
    return GenerationParams(
        messages=(ChatMessage(role="user", content=text),),
        max_tokens=tokens,
        sampling=SamplingParams(temperature=0),
        prefix_cache=False,
    )


def _texts(loaded: tuple[Any, Any], chunk: int) -> dict[str, str]:
    model, tokenizer = loaded
    engine = BatchEngine(model, tokenizer, prefill_step_size=chunk)
    requests = {"short": _params("hello there"), "long": _params(LONG), "mid": _params(LONG[:300])}
    return {k: text_of(v) for k, v in run_requests(engine, requests).items()}


def test_prompts_read_together_and_in_chunks_write_the_same_text(
    loaded: tuple[Any, Any], installed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    with_kernel = _texts(loaded, chunk=128)
    assert installed, "the prompts' attention did not run on the kernel"
    monkeypatch.setenv("EXO_PREFILL_ATTENTION", "off")
    calls = len(installed)
    assert _texts(loaded, chunk=128) == with_kernel
    assert len(installed) == calls  # off: every call went back to mlx-lm


def test_logits_agree_with_mlx_attention(
    loaded: tuple[Any, Any], installed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    tokens = mx.array(tokenizer.encode(LONG))[None]

    def logits() -> np.ndarray:
        cache = make_prompt_cache(model)
        out = [model(tokens[:, i : i + 100], cache=cache) for i in range(0, tokens.shape[1], 100)]
        return np.array(mx.concatenate(out, axis=1))

    got = logits()
    monkeypatch.setenv("EXO_PREFILL_ATTENTION", "off")
    want = logits()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.99


def _qkv(rows: int, dtype: mx.Dtype = mx.float32) -> tuple[mx.array, mx.array, mx.array]:
    return (
        mx.zeros((1, 4, rows, 16), dtype),
        mx.zeros((1, 2, 9, 16), dtype),
        mx.zeros((1, 2, 9, 16), dtype),
    )


@pytest.mark.parametrize(
    ("rows", "dtype", "mask", "sinks", "covered"),
    [
        (3, mx.float32, "causal", None, True),
        (3, mx.float32, None, None, True),
        (3, mx.float32, mx.ones((1, 1, 3, 9), mx.bool_), None, True),
        (3, mx.float32, mx.zeros((3, 9)), None, True),
        (1, mx.float32, None, None, False),  # a one-token step
        (3, mx.float16, "causal", None, False),
        (3, mx.float32, mx.ones((1, 4, 3, 9), mx.bool_), None, False),  # a mask per head
        (3, mx.float32, mx.ones((1, 1, 3, 9), mx.int32), None, False),
        (3, mx.float32, "causal", mx.zeros((4,)), False),  # attention sinks
    ],
)
def test_what_the_kernel_covers(
    rows: int, dtype: mx.Dtype, mask: Any, sinks: Any, covered: bool
) -> None:
    q, k, v = _qkv(rows, dtype)
    assert prefill_attention.covers(q, k, v, mask, sinks) is covered


def test_the_setting() -> None:
    assert prefill_attention.requested({})
    assert not prefill_attention.requested({"EXO_PREFILL_ATTENTION": "off"})
