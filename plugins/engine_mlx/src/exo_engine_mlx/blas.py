"""A dense fp32 fast path for MLX on the CPU, and the fast BLAS that makes it pay.

Finding and preloading the BLAS is the core's, shared with other engines: import it from
`exo_core.plugin.engine`. EXO_DENSE=auto|on|off selects the dense fast path.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

__all__ = [
    "dense_fp32_bytes",
    "dequantize_model",
    "gemm_gflops",
    "should_dequantize",
]


def gemm_gflops(n: int = 1024, seconds: float = 1.0) -> float:
    """fp32 GFLOP/s of mx.matmul on n x n in this process (whatever BLAS it has loaded)."""
    a = mx.random.normal((n, n), dtype=mx.float32)
    b = mx.random.normal((n, n), dtype=mx.float32)
    mx.eval(a, b, a @ b)  # warm-up
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or reps == 0:
        mx.eval(a @ b)
        reps += 1
    return 2 * n**3 * reps / elapsed / 1e9


# ---------------------------------------------------------------- dense fp32 fast path


def dequantize_model(model: nn.Module) -> int:
    """Turn QuantizedLinear/QuantizedEmbedding into float32 Linear/Embedding, in place.

    With a fast BLAS, dense fp32 matmuls are far faster on the CPU than MLX's scalar quantized
    kernels. Other fp16/bf16 parameters are upcast too (the CPU backend must not run them).
    Returns the number of layers replaced.
    """
    replaced: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding):
            w = mx.dequantize(
                m.weight, m.scales, m.get("biases"), m.group_size, m.bits, mode=m.mode
            ).astype(mx.float32)
            if isinstance(m, nn.QuantizedEmbedding):
                dense: nn.Module = nn.Embedding(w.shape[0], w.shape[1])
            else:
                dense = nn.Linear(w.shape[1], w.shape[0], bias="bias" in m)
                if "bias" in m:
                    dense.bias = m["bias"].astype(mx.float32)
            dense.weight = w
            replaced.append((name, dense))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    half = (mx.float16, mx.bfloat16)
    model.apply(lambda x: x.astype(mx.float32) if x.dtype in half else x)
    mx.eval(model.parameters())
    return len(replaced)


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    # The header alone (8-byte length + JSON) gives every shape; no tensor is read.
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(n))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def dense_fp32_bytes(model_dir: Path) -> int:
    """Bytes the weights of an MLX model directory take once dequantized to float32."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    quant: dict[str, Any] = config.get("quantization") or {}
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(model_dir.glob("model*.safetensors")):
        shapes.update(_safetensors_shapes(f))
    total = 0
    for key, shape in shapes.items():
        module, _, part = key.rpartition(".")
        quantized = f"{module}.scales" in shapes
        if quantized and part in ("scales", "biases"):
            continue
        count = math.prod(shape)
        if quantized:
            entry = quant.get(module)
            bits = entry["bits"] if isinstance(entry, dict) else quant.get("bits", 4)
            count = count * 32 // int(bits)  # packed uint32 words -> elements
        total += 4 * count
    return total


def should_dequantize(
    model_dir: Path, available_memory_bytes: int, env: Mapping[str, str] | None = None
) -> bool:
    """Whether to run `model_dir` dense in fp32: EXO_DENSE=on/off, or auto for small models.

    auto: only quantized models, and only when the dense weights stay under 25% of the
    available memory and under 4 GiB (beyond that memory traffic, not BLAS, dominates).
    """
    env = os.environ if env is None else env
    mode = env.get("EXO_DENSE", "auto").strip().lower()
    if mode in ("on", "1", "yes", "true"):
        return True
    if mode in ("off", "0", "no", "false"):
        return False
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if not config.get("quantization"):
        return False
    dense = dense_fp32_bytes(Path(model_dir))
    return dense < available_memory_bytes // 4 and dense < 4 * 1024**3
