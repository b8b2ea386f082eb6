"""Quantized weights on exo's CPU kernels against the dense fp32 path.

Float activations (the default): tiny random models of each GGUF quantization and SmolLM2
agree within 1e-4 of the largest logit (float32 sums in another order), SmolLM2's greedy text
is identical. int8 activations (EXO_CPU_KERNELS=int8, llama.cpp's way) are not exact: on
SmolLM2 the logits move by ~2 % (median) and up to ~7 % of the largest logit, and the argmax
changes only where the dense path's top two are nearly tied (margins <= 0.13 seen); asserted
as <= 12 % and "same argmax wherever the dense margin exceeds 0.5".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_sampler

import exo_mlx_cpu_kernels as kernels
from exo_engine_mlx import cpu_kernels
from exo_engine_mlx.blas import dequantize_model
from exo_engine_mlx.cpu_kernels import (
    KERNEL_GFLOPS,
    KERNEL_GFLOPS_AVX512,
    KernelQuantizedEmbedding,
    KernelQuantizedLinear,
    compact_scales,
    dense_weight,
    dequantize_pays,
    int8_activations,
    keep_dense_weights,
    kept_dense_budget,
    kept_dense_pays,
    kernel_rate,
    kernel_ready,
    kernels_requested,
    use_kernels,
)
from exo_engine_mlx.embedded import embedded_gguf_path
from exo_engine_mlx.fused_linear import fuse_linears
from exo_engine_mlx.gguf import import_gguf

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels not built")

MakeGGUF = Callable[..., Path]
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "What is the capital of France?",
    "List three prime numbers and explain why they are prime.",
]


# Of the largest |logit| per position: the worst position, and the median one. The worst is a
# tail of chaotic int8 noise (each layer re-rounds x, so a tiny change flips some roundings):
# on SmolLM2's 89-token text it ranged 0.057-0.127 between the AVX2 and VNNI kernels (the same
# integers, float sums in another order) and 0.1 % changes of the embedding's scales; the
# median stayed 0.027-0.034.
INT8_MAX_LOGIT_ERROR = 0.2
INT8_MEDIAN_LOGIT_ERROR = 0.05
INT8_TIE_MARGIN = 0.5  # below this dense top-1 margin, int8 may pick the runner-up


def _kernel_model(model_dir: Path, int8: bool) -> tuple[Any, Any]:
    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    assert kernel_ready(model)
    assert use_kernels(model, int8=int8) > 0
    return model, tokenizer


def _both(model_dir: Path, int8: bool = False) -> tuple[Any, Any, Any]:
    kernel_model, tokenizer = _kernel_model(model_dir, int8)
    dense_model = mlx_lm.load(str(model_dir))[0]
    dequantize_model(dense_model)
    return kernel_model, dense_model, tokenizer


def _assert_int8_close(got: np.ndarray, want: np.ndarray) -> None:
    """int8-activation logits against dense ones, [positions, vocab]: the stated tolerance."""
    top = np.abs(want).max(-1)
    error = np.abs(got - want).max(-1) / top
    assert error.max() <= INT8_MAX_LOGIT_ERROR
    assert np.median(error) <= INT8_MEDIAN_LOGIT_ERROR
    ranked = np.sort(want, axis=-1)
    clear = ranked[:, -1] - ranked[:, -2] > INT8_TIE_MARGIN
    assert np.array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


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
    int8_model, _ = _kernel_model(tmp_path / "m", int8=True)
    for rows in (ids, ids[:, :1]):  # a prefill-sized call and a one-token call
        got, want = np.array(kernel_model(rows)), np.array(dense_model(rows))
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
        _assert_int8_close(np.array(int8_model(rows))[0], want[0])


def test_env_turns_kernels_off() -> None:
    assert int8_activations({"EXO_CPU_KERNELS": "int8"})
    assert not int8_activations({"EXO_CPU_KERNELS": "float"})
    assert kernels_requested({}) and kernels_requested({"EXO_CPU_KERNELS": "int8"})
    assert not kernels_requested({"EXO_CPU_KERNELS": "off"})
    assert not kernels_requested({"EXO_DENSE": "on"})


def test_prefill_path_follows_the_measured_costs() -> None:
    """The kernel for a decode batch, BLAS for a prompt: from ~19 rows on a 576x1536 layer,
    ~220 on the 49152x576 head (dequantizing its 113 MB costs that much)."""
    layer, head = (1536, 576), (49152, 576)
    assert not dequantize_pays(8, *layer) and not dequantize_pays(16, *layer)
    assert dequantize_pays(24, *layer) and dequantize_pays(360, *layer)
    assert not dequantize_pays(128, *head) and dequantize_pays(256, *head)
    paying = [dequantize_pays(rows, *layer) for rows in range(1, 600)]
    assert paying == sorted(paying)  # once BLAS wins, it keeps winning with more rows


def test_the_avx512_kernel_keeps_short_prompts() -> None:
    """AVX-512 serves 4-bit layers whose width 64 divides at ~0.9x the sgemm's rate: the kernel
    up to ~120 rows (a 45-token prompt), BLAS for 8 such prompts at once."""
    rate = kernel_rate(4, 1536, "avx512+avx2+fma")
    assert rate == KERNEL_GFLOPS_AVX512 > KERNEL_GFLOPS
    assert kernel_rate(8, 1536, "avx512+avx2+fma") == KERNEL_GFLOPS  # 8 bits: AVX2
    assert kernel_rate(4, 1568, "avx512+avx2+fma") == KERNEL_GFLOPS  # 64 does not divide it
    assert kernel_rate(4, 1536, "avx2+fma") == KERNEL_GFLOPS
    layer = (576, 1536)
    assert not dequantize_pays(45, *layer, rate) and not dequantize_pays(100, *layer, rate)
    assert dequantize_pays(150, *layer, rate) and dequantize_pays(360, *layer, rate)


def test_kept_dense_weights_give_the_same_prompt_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Float32 copies kept for prompts: all layers or none within the budget, never the head,
    and a prompt's rows (dequantize + BLAS) give bit for bit what dequantizing each call gave."""
    monkeypatch.setattr(cpu_kernels, "_fast_blas", lambda: True)  # BLAS is taken from 24 rows
    layers = [
        nn.QuantizedLinear(*shape, bias=False, group_size=32, bits=4)
        for shape in ((128, 96), (96, 128))
    ]
    head = nn.QuantizedEmbedding(64, 128, group_size=32, bits=4)
    model = nn.Sequential(*layers, nn.Sequential(head))  # the head is listed, not called
    use_kernels(model, threads=2)
    body = nn.Sequential(*layers)
    x = mx.random.normal((2, 30, 128), key=mx.random.key(2))
    prompt, one = np.array(body(x)), np.array(body(x[:, :1]))
    needed = 2 * 4 * 96 * 128
    assert keep_dense_weights(model, needed - 1) == 0
    assert all(getattr(m, "kept_dense", None) is None for m in (*layers, head))
    assert keep_dense_weights(model, needed) == needed
    assert getattr(head, "kept_dense", None) is None and not any(
        "kept" in key for key, _ in tree_flatten(model.parameters())
    )
    for m in layers:
        kept = dense_weight(m)
        holder = getattr(m, "kept_dense", None)
        assert holder is not None and kept is holder.weight
        fresh = kernels.dequantize(m["weight"], m["scales"], m["biases"], 32, 4)
        assert mx.array_equal(kept, fresh)
    assert np.array_equal(np.array(body(x)), prompt)
    assert np.array_equal(np.array(body(x[:, :1])), one)


def test_kept_dense_budget() -> None:
    gib = 1 << 30
    assert kept_dense_budget(4 * gib, {}) == gib // 2
    assert kept_dense_budget(64 * gib, {}) == gib
    assert kept_dense_budget(64 * gib, {"EXO_KEEP_DENSE_BYTES": "0"}) == 0
    assert kept_dense_budget(gib, {"EXO_KEEP_DENSE_BYTES": "1000"}) == 1000
    with pytest.raises(ValueError, match="EXO_KEEP_DENSE_BYTES"):
        kept_dense_budget(gib, {"EXO_KEEP_DENSE_BYTES": "lots"})
    # Where the copies do not pay, none unless the setting asks for them.
    assert kept_dense_budget(64 * gib, {}, pays=False) == 0
    assert kept_dense_budget(64 * gib, {"EXO_KEEP_DENSE_BYTES": "1000"}, pays=False) == 1000


def test_kept_dense_copies_pay_only_where_the_kernel_is_slow() -> None:
    """AVX-512 runs 4-bit layers near the sgemm's rate: float32 copies buy a prompt little
    there (SmolLM2: 0-5 % for 425 MB), so none are kept; on AVX2, or for 8-bit layers, they
    pay. The head is not a kept layer and does not count."""
    four = nn.Sequential(nn.QuantizedLinear(128, 128, bias=False, group_size=32, bits=4))
    eight = nn.Sequential(nn.QuantizedLinear(128, 128, bias=False, group_size=32, bits=8))
    head = nn.Sequential(nn.QuantizedEmbedding(64, 96, group_size=32, bits=4))
    for model in (four, eight, head):
        use_kernels(model, threads=1)
    assert not kept_dense_pays(four, "avx512+avx2+fma")
    assert kept_dense_pays(four, "avx2+fma")
    assert kept_dense_pays(eight, "avx512+avx2+fma")
    assert not kept_dense_pays(head, "avx2+fma")


def _kernel_layers(model: nn.Module) -> list[nn.Module]:
    kinds = (KernelQuantizedLinear, KernelQuantizedEmbedding)
    return [m for _, m in model.named_modules() if isinstance(m, kinds)]


@pytest.mark.parametrize(
    ("weight_type", "embd_type", "tied"),
    [("Q4_0", "Q8_0", True), ("Q4_1", "Q4_1", False), ("Q8_0", "Q8_0", True)],
)
def test_gguf_scales_stay_float16_with_the_same_bits(
    tiny_gguf: MakeGGUF,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    weight_type: str,
    embd_type: str,
    tied: bool,
) -> None:
    """A GGUF's scales and biases (float16 in the file; Q4_0's bias is -8 * scale) stay 16-bit
    on the kernels, so a decode step reads 5 bits a 4-bit weight, not 6; the logits of a
    prompt and of a one-token step are bit for bit those of float32 scales."""
    model_dir = import_gguf(
        tiny_gguf(weight_type=weight_type, embd_type=embd_type, tied=tied), tmp_path / "m", "t"
    )
    half_model, _ = _kernel_model(model_dir, int8=False)
    layers = _kernel_layers(half_model)
    assert layers and all(m["scales"].dtype == m["biases"].dtype == mx.float16 for m in layers)
    # Q4_0's biases (-8 x scale) are implied, not read: 4.5 bits a weight; the logits below
    # are still those of the stored float32 biases.
    q4_0 = [m for m in layers if isinstance(m, KernelQuantizedLinear)]
    assert q4_0 and all(m.implicit_bias == (weight_type == "Q4_0") for m in q4_0)
    monkeypatch.setattr(
        cpu_kernels, "compact_scales", lambda s, b: (s.astype(mx.float32), b.astype(mx.float32))
    )
    full_model, _ = _kernel_model(model_dir, int8=False)
    assert all(m["scales"].dtype == mx.float32 for m in _kernel_layers(full_model))
    assert not any(m.implicit_bias for m in _kernel_layers(full_model))
    ids = mx.array([[3, 17, 42, 99, 5, 250, 7]])
    for rows in (ids, ids[:, :1]):
        assert np.array_equal(np.array(half_model(rows)), np.array(full_model(rows)))


def test_compact_scales_picks_the_narrowest_exact_type() -> None:
    f16_exact = mx.array([[0.5, -4.0, 6.103515625e-05, 1024.0]])
    bf16_only = mx.array([[1e-30, 2.0**100, 0.5, 1.0]])  # outside float16's range
    neither = mx.array([[0.1, 1.0 / 3.0, 2.0, 4.0]])
    nan = mx.array([[float("nan"), 1.0, 2.0, 3.0]])
    assert [a.dtype for a in compact_scales(f16_exact, -8 * f16_exact)] == [mx.float16] * 2
    bf16 = bf16_only.astype(mx.bfloat16).astype(mx.float32)
    assert [a.dtype for a in compact_scales(bf16, f16_exact)] == [mx.bfloat16] * 2
    for odd in (neither, nan):
        got = compact_scales(f16_exact, odd)
        assert [a.dtype for a in got] == [mx.float32] * 2
        assert np.array_equal(np.array(got[1]), np.array(odd), equal_nan=True)


def test_unsupported_layers_are_left_alone() -> None:
    layer = nn.QuantizedLinear(64, 32, group_size=32, bits=3)
    model = nn.Sequential(layer)
    assert not kernel_ready(model)
    assert use_kernels(model) == 0 and type(layer) is nn.QuantizedLinear


@pytest.mark.parametrize(("bits", "group_size"), [(4, 32), (8, 64)])
@pytest.mark.parametrize("int8", [False, True])
def test_fused_layers_equal_each_layer_alone(bits: int, group_size: int, int8: bool) -> None:
    """q/k/v-like layers fused into one kernel call: each part of the output is bit for bit
    the layer's own; the layers' parameters become views of the fused weights; many rows
    (a prefill: dequantize + BLAS) still go through the layers themselves."""
    layers = [
        nn.QuantizedLinear(128, n, bias=False, group_size=group_size, bits=bits)
        for n in (96, 32, 40)
    ]
    model = nn.Sequential(*layers)
    assert use_kernels(model, threads=2, int8=int8) == 3
    x = mx.random.normal((3, 14, 128), key=mx.random.key(1))
    alone = [[np.array(m(rows)) for m in layers] for rows in (x[:1, :1], x[:, :1], x)]
    fused = fuse_linears(layers)
    assert fused is not None and fused.ends == (96, 128, 168)
    assert mx.array_equal(layers[1]["weight"], fused.weight[96:128])
    for rows, want in zip((x[:1, :1], x[:, :1], x), alone, strict=True):
        got = fused(rows)
        for part, expected in zip(got, want, strict=True):
            assert np.array_equal(np.array(part), expected)
        # and the layers alone, now on views of the fused weights
        assert all(np.array_equal(np.array(m(rows)), e) for m, e in zip(layers, want, strict=True))
    biased = nn.QuantizedLinear(128, 8, bias=True, group_size=group_size, bits=bits)
    use_kernels(nn.Sequential(biased), int8=int8)
    assert fuse_linears([layers[0], biased]) is None


@pytest.mark.parametrize("int8", [False, True])
def test_q4_0_layers_fuse_with_implied_biases(int8: bool) -> None:
    """Layers whose biases are Q4_0's (-8 x a float16 scale) take them as implied, alone and
    fused, with the bits of the stored biases (a layer with other biases does not)."""
    layers = [nn.QuantizedLinear(128, n, bias=False, group_size=32, bits=4) for n in (96, 32)]
    for i, m in enumerate(layers):
        scales = mx.random.uniform(-0.02, 0.02, m["scales"].shape, key=mx.random.key(i))
        m["scales"] = scales.astype(mx.float16).astype(mx.float32)
        m["biases"] = -8 * m["scales"]
    x = mx.random.normal((2, 1, 128), key=mx.random.key(1))
    want = [np.array(x @ mx.dequantize(m.weight, m.scales, m.biases, 32, 4).T) for m in layers]
    assert use_kernels(nn.Sequential(*layers), threads=2, int8=int8) == 2
    assert all(m.implicit_bias for m in layers)
    fused = fuse_linears(layers)
    assert fused is not None and fused.implicit_bias and fused.read_biases is None
    stored = dataclasses.replace(fused, implicit_bias=False)
    for got, alone, ref, m in zip(fused(x), stored(x), want, layers, strict=True):
        assert np.array_equal(np.array(got), np.array(alone))
        assert np.array_equal(np.array(m(x)), np.array(alone))
        np.testing.assert_allclose(np.array(got), ref, rtol=0.05 if int8 else 1e-4, atol=0.05)
    other = nn.QuantizedLinear(128, 8, bias=False, group_size=32, bits=4)
    other["scales"] = layers[0]["scales"][:8].astype(mx.float32)
    other["biases"] = -8 * other["scales"] + 2.0**-14
    use_kernels(nn.Sequential(other), int8=int8)
    assert not other.implicit_bias


@pytest.mark.smollm
@pytest.mark.slow
def test_smollm_greedy_text_identical_to_dense(tmp_path: Path) -> None:
    """Greedy tokens of the float path are the dense path's argmax at every position; the
    int8 path's logits on the same text stay within the stated tolerance."""
    model_dir = import_gguf(embedded_gguf_path(), tmp_path / "smol", "smollm2")
    kernel_model, dense_model, tokenizer = _both(model_dir, int8=False)
    int8_model, _ = _kernel_model(model_dir, int8=True)
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
        text = mx.array([ids + new[:-1]])
        dense = dense_model(text)[0]
        logits = dense[len(ids) - 1 :]
        assert np.array(mx.argmax(logits, axis=-1)).tolist() == new, prompt
        _assert_int8_close(np.array(int8_model(text)[0]), np.array(dense))
