"""Loading a model in the runner: mlx-lm, float32 on the CPU, dense weights when they pay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import psutil
from loguru import logger

from exo_engine_mlx.blas import dequantize_model, loaded_blas, should_dequantize


def _upcast(model: nn.Module) -> None:
    # The CPU backend runs fp16/bf16 far slower than fp32 (and quantized fp16 ~46x slower).
    half = (mx.float16, mx.bfloat16)
    model.apply(lambda x: x.astype(mx.float32) if x.dtype in half else x)


def load_model(model_dir: str) -> tuple[Any, Any]:
    """(model, tokenizer) from a local MLX model directory, ready to run on this device."""
    from mlx_lm import load

    model, tokenizer = load(model_dir)[:2]
    if mx.default_device() == mx.cpu:
        _upcast(model)
        if should_dequantize(Path(model_dir), psutil.virtual_memory().available):
            replaced = dequantize_model(model)
            logger.info(f"dense fp32 weights: dequantized {replaced} layers")
        logger.info(f"BLAS in this runner: {loaded_blas() or 'bundled reference BLAS'}")
    mx.eval(model.parameters())
    return model, tokenizer
