"""A prompt's attention on the CPU as exo's tiled kernel instead of MLX's fallback graph.

mlx-lm's models call `mlx_lm.models.base.scaled_dot_product_attention`, which on the CPU runs
MLX's fallback: every score of every query row against every key in memory, then the mask, a
softmax and a second product, each a pass over that array. A prompt is read in chunks
(EXO_PREFILL_CHUNK), each chunk attending to everything before it, so that cost grew with the
prompt: on SmolLM2 a chunk of 256 rows against 2,048 keys took ~93 ms a layer (10 ms of it the
products), more than the rest of the model, and a fresh 2k-token prompt was read at half the
rate of a 512-token one (bench/profile_long_prefill.py). `exo_mlx_cpu_kernels.prefill_attention`
keeps the scores of a tile of rows against 64 keys in the cache, skips what a causal mask hides
and runs on every core; equal to MLX's attention up to float32 rounding.

`install()` puts the wrapper in the name every loaded mlx-lm model module imported; the wrapper
takes the kernel for float32 prompts (more than one query row) on the CPU with a causal, boolean
or additive mask shared by the heads, and hands every other call (one-token steps, quantized
caches, attention sinks, other dtypes or devices) to mlx-lm's function unchanged.
EXO_PREFILL_ATTENTION=auto (default) | off: read at load and at every call.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import mlx.core as mx

import exo_mlx_cpu_kernels as kernels

_OFF = ("off", "0", "no", "false")
_NAME = "scaled_dot_product_attention"


def requested(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("EXO_PREFILL_ATTENTION", "auto").strip().lower() not in _OFF


def covers(q: mx.array, k: mx.array, v: mx.array, mask: Any, sinks: Any) -> bool:
    """Whether the kernel computes this call: float32 prompt rows on the CPU, no sinks, a mask
    that is "causal", None, or a boolean/float array the same for every head."""
    if sinks is not None or q.ndim != 4 or q.shape[2] < 2 or mx.default_device() != mx.cpu:
        return False
    if not q.dtype == k.dtype == v.dtype == mx.float32:
        return False
    if isinstance(mask, str):
        return mask == "causal" and k.shape[2] >= q.shape[2]
    if mask is None:
        return True
    if mask.ndim > 4 or (mask.ndim == 4 and mask.shape[1] != 1):
        return False
    return mask.dtype == mx.bool_ or mx.issubdtype(mask.dtype, mx.floating)


def _wrapped(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        cache: Any,
        scale: float,
        mask: Any,
        sinks: Any = None,
    ) -> mx.array:
        if (
            hasattr(cache, "bits")
            or not covers(queries, keys, values, mask, sinks)
            or not requested()  # read per call: a bench switches it in one process
        ):
            return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
        if isinstance(mask, str):
            return kernels.prefill_attention(queries, keys, values, scale, causal=True)
        return kernels.prefill_attention(queries, keys, values, scale, mask)

    scaled_dot_product_attention.exo_original = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


def install(env: Mapping[str, str] | None = None) -> int:
    """Put the wrapper in mlx-lm's base module and in every loaded model module that imported
    its function (call after the model is built: its module is then imported). Returns the
    number of modules that hold the wrapper; 0 where the kernels are not built or the setting
    is off."""
    if not kernels.available() or not requested(env):
        return 0
    from mlx_lm.models import base

    original = getattr(base, _NAME)
    original = getattr(original, "exo_original", original)
    wrapper = getattr(base, _NAME)
    if getattr(wrapper, "exo_original", None) is None:
        wrapper = _wrapped(original)
    held = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models") or module is None:
            continue
        if getattr(module, _NAME, None) is original:
            setattr(module, _NAME, wrapper)
        held += getattr(module, _NAME, None) is wrapper
    return held
