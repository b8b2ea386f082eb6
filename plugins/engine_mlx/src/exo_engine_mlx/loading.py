"""Loading a model in the runner: mlx-lm, float32 on the CPU, dense weights when they pay.

On the CPU a quantized model keeps its 4/8-bit weights when exo's kernels are built and handle
every quantized layer (`cpu_kernels`); otherwise a small model is dequantized to dense fp32.

The weights are loaded lazily. A pipeline rank keeps only its layers (plus the embedding or the
head where it needs them) before anything is read; a tensor rank shards every layer and keeps
only its slices. Evaluation then reads just what the rank kept.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn
import psutil
from loguru import logger

from exo_core.plugin.engine import loaded_blas
from exo_engine_mlx.bitlinear import convert_bitlinear, needs_conversion
from exo_engine_mlx.blas import dequantize_model, should_dequantize
from exo_engine_mlx.cpu_kernels import (
    keep_dense_weights,
    kept_dense_budget,
    kept_dense_pays,
    kernel_ready,
    kernels_requested,
    simd,
    use_kernels,
)
from exo_engine_mlx.idle_memory import give_back_freed_memory
from exo_engine_mlx.metal_fallbacks import install as install_metal_fallbacks


@dataclass(frozen=True)
class ShardPlan:
    """Which part of the model this runner holds within its group."""

    sharding: Literal["pipeline", "tensor"]
    group: Any  # mx.distributed.Group
    start_layer: int = 0
    end_layer: int = 0
    # Every rank's layer count, in rank order (a pipeline split by mlx-lm needs them all).
    layer_counts: tuple[int, ...] = ()


def _upcast(model: nn.Module) -> None:
    # The CPU backend runs fp16/bf16 far slower than fp32 (and quantized fp16 ~46x slower).
    half = (mx.float16, mx.bfloat16)
    model.apply(lambda x: x.astype(mx.float32) if x.dtype in half else x)
    _float32_hadamard_embeddings(model)


def _float32_hadamard_embeddings(model: nn.Module) -> None:
    """A Hadamard pack's embedding (prism_hadamard_qwen35) casts its rows to float16 itself.
    Alone that is harmless (the first float32 layer promotes them), but a pipeline rank sizes
    the hidden state it receives by its own embedding's output: float16 there against the
    float32 the rank before sends. Its output is cast on to float32 (the same values)."""
    pack = sys.modules.get("mlx_lm.models.prism_hadamard_qwen35")
    if pack is None:  # building such a model imports it: none here
        return
    embedding = pack.HadamardQuantizedEmbedding

    class Float32Output(embedding):
        def __call__(self, indices: mx.array) -> mx.array:
            return super().__call__(indices).astype(mx.float32)

    for _, module in model.named_modules():
        if type(module) is embedding:
            module.__class__ = Float32Output


def _quantized_kernels(model: nn.Module) -> bool:
    """Whether to keep the weights quantized and run exo's CPU kernels on them."""
    return mx.default_device() == mx.cpu and kernels_requested() and kernel_ready(model)


def _dense(model_dir: str) -> bool:
    """Whether to run dense float32 weights (the CPU, with a small quantized model)."""
    return mx.default_device() == mx.cpu and should_dequantize(
        Path(model_dir), psutil.virtual_memory().available
    )


def _for_device(model: nn.Module, dense: bool, quantized_kernels: bool) -> None:
    if mx.default_device() != mx.cpu:
        return
    _upcast(model)
    if quantized_kernels:
        switched = use_kernels(model)
        logger.info(f"quantized weights on exo's CPU kernels: {switched} layers ({simd()})")
        available = psutil.virtual_memory().available
        budget = kept_dense_budget(available, pays=kept_dense_pays(model))
        if kept := keep_dense_weights(model, budget):
            logger.info(f"float32 copies of the weights kept for prompts: {kept / 1e6:.0f} MB")
    elif dense:
        replaced = dequantize_model(model)
        logger.info(f"dense fp32 weights: dequantized {replaced} layers")
    logger.info(f"BLAS in this runner: {loaded_blas() or 'bundled reference BLAS'}")
    # Imported here: it imports mlx-lm (seconds on a busy machine), which a rank that fails to
    # join its group should not wait for.
    from exo_engine_mlx.compiled_step import compile_decode_step, compile_requested
    from exo_engine_mlx.prefill_attention import install as install_prefill_attention

    if install_prefill_attention():
        logger.info("prompts' attention on exo's tiled CPU kernel")
    if compile_requested():
        logger.info(f"compiled one-token step: {compile_decode_step(model)} layers")


def _eval_by_layer(model: nn.Module) -> None:
    # One layer at a time: a tensor rank then holds at most one layer's full weights while
    # slicing, never the whole model.
    for layer in getattr(model, "layers", []):
        if layer is not None:  # a wrapper shows mlx-lm's pipeline() list: None = not here
            mx.eval(layer.parameters())
    mx.eval(model.parameters())


def load_model(
    model_dir: str, shard: ShardPlan | None = None, *, trust_remote_code: bool = False
) -> tuple[Any, Any]:
    """(model, tokenizer) from a local MLX model directory, ready to run on this device.

    With a `shard`, the model is this rank's part of it: a `PipelineStage` or a model whose
    layers are sharded over the group. `trust_remote_code` (the card's) lets transformers
    import a tokenizer the repo ships as Python (Kimi K2's); the model is always mlx-lm's."""
    from mlx_lm import load

    tokenizer_config = {"trust_remote_code": True} if trust_remote_code else None
    model, tokenizer = load(model_dir, lazy=True, tokenizer_config=tokenizer_config)[:2]
    install_metal_fallbacks()  # Muse Spark's fused kernels as MLX ops where there is no Metal
    if needs_conversion() and (converted := convert_bitlinear(model)):
        logger.info(f"BitNet ternary layers as 8-bit affine layers (no Metal): {converted}")
    quantized_kernels = _quantized_kernels(model)
    dense = not quantized_kernels and _dense(model_dir)
    if shard is not None and shard.sharding == "pipeline":
        from exo_engine_mlx.distributed.pipeline import split_pipeline

        # Split before any conversion: the layers left out are dropped while still lazy.
        model = split_pipeline(
            model, shard.start_layer, shard.end_layer, shard.layer_counts, shard.group
        )
    elif shard is not None:
        from exo_engine_mlx.distributed.tensor import dequantize_sharded, shard_tensor

        # Sharded first, so that only this rank's slices are read and dequantized.
        shard_tensor(model, shard.group)
        if dense:
            dequantize_sharded(model)
    _for_device(model, dense, quantized_kernels)
    _eval_by_layer(model)
    # Full tensors read only to be sliced, and float32 scales read only to be narrowed, are
    # free now: give them back, not to MLX's cache nor to the C heap's free lists.
    mx.clear_cache()
    give_back_freed_memory()
    return model, tokenizer
