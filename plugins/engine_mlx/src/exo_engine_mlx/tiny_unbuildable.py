"""Families of the README table that have no tiny model, or that the engine cannot run yet,
and why.

`tests/test_every_family.py` runs every architecture mlx-lm serves on a tiny random-weight
model built from `tiny_configs/<model_type>.json`. A family in `UNBUILDABLE` is reported by
that test with the reason instead of being built; a family with neither a tiny config nor an
entry fails the test. A family in `ENGINE_GAPS` builds, but the engine cannot generate with
it: its test is a strict expected failure, so it fails once the gap is closed and the entry
must go. Keep the reasons precise (what is missing, where).
"""

from __future__ import annotations

# model_type -> why no tiny model of it runs here. Sorted by name.
UNBUILDABLE: dict[str, str] = {
    "bitnet": "its BitLinear layers run a Metal kernel (mx.fast.metal_kernel): no Metal here",
}

# model_type -> why the engine cannot serve it although mlx-lm builds and runs it.
_BATCHING = "mlx-lm's BatchGenerator cannot batch its cache ({}: 'does not yet support batching with history'), and the engine always generates through it"
ENGINE_GAPS: dict[str, str] = {
    "deepseek_v41": _BATCHING.format("deepseek_v41.LayerCache"),
    "deepseek_v41_text": _BATCHING.format("deepseek_v41.LayerCache"),
    "llama4": _BATCHING.format("ChunkedKVCache, chunked attention"),
}
