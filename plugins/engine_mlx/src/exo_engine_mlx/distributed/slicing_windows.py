"""What `SlicedStage` needs for the families whose forward finds things by list position or
keeps more than the layers in its stack: sliding-window patterns (Cohere 2, EXAONE 4 and
MoE, Gear, Laguna), learned position embeddings or a head inside the inner model (GPT-2,
GPT-BigCode, GPT-NeoX, Lille), a forward that takes its mask as an argument (Phixtral) and
KV-reuse layers (AFM 7). `slicing_families.SLICED_MODEL_TYPES` puts these into their `Slicing`s;
each is proven on 2 ranks by test_every_family_groups.

A slice's first layer is not the model's: where a forward picks its mask's cache by a
position in the whole model (`cache[pattern - 1]`, `cache[self.swa_idx]`), the index is
re-found on the slice, and where it tells sliding from global layers by the loop index, the
layer's own flag (set from its index in the whole model) decides instead.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache


def _first(flags: list[bool], value: bool, missing: int | None) -> int | None:
    """The slice's first layer whose flag is `value`; `missing` where it has none (that
    kind's mask is then never used)."""
    return flags.index(value) if value in flags else missing


def exaone4_indices(inner: Any) -> None:
    local = [bool(layer.self_attn.is_local) for layer in inner.layers]
    inner.swa_idx = _first(local, True, None)
    inner.full_idx = _first(local, False, 0)


def exaone_moe_indices(inner: Any) -> None:
    sliding = [bool(layer.is_sliding_window) for layer in inner.layers]
    inner.swa_idx = _first(sliding, True, None)
    inner.ga_idx = _first(sliding, False, None)


def laguna_indices(inner: Any) -> None:
    sliding = [bool(layer.use_sliding) for layer in inner.layers]
    inner.fa_idx = _first(sliding, False, 0)
    inner.swa_idx = _first(sliding, True, None)


def gear_indices(inner: Any) -> None:
    kinds = [layer.attention_type for layer in inner.layers]
    inner.layer_types = kinds
    for attr, kind in (
        ("fa_idx", "full_attention"),
        ("swa_idx", "sliding_attention"),
        ("conv_idx", "conv_mixer"),
    ):
        setattr(inner, attr, kinds.index(kind) if kind in kinds else None)


def cohere2_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Cohere 2's forward on a slice: its own tells global layers by `i % pattern` of the
    loop index and takes the global mask from `cache[pattern - 1]`; each attention block
    knows its kind from its index in the whole model, so that decides here."""
    h = inner.embed_tokens(inputs)
    sliding = [bool(layer.self_attn.use_sliding_window) for layer in inner.layers]
    return inner.norm(windowed_layers(inner, h, cache, sliding))


def windowed_layers(
    inner: Any, h: mx.array, cache: list[Any] | None, sliding: list[bool]
) -> mx.array:
    """h through a slice's layers where each layer says whether it slides (`sliding`, from
    its index in the whole model): the full and the window mask are built from the slice's
    first cache of each kind, not from list positions, which a slice shifts."""
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    full = next((c for c, s in zip(caches, sliding, strict=True) if not s), None)
    window = next((c for c, s in zip(caches, sliding, strict=True) if s), None)
    full_mask = create_attention_mask(h, full)
    window_mask = create_attention_mask(h, window, window_size=inner.window_size)
    for layer, c, s in zip(inner.layers, caches, sliding, strict=True):
        h = layer(h, window_mask if s else full_mask, c)
    return h


def cohere2_caches(inner: Any) -> list[Any]:
    return [
        RotatingKVCache(max_size=inner.window_size, keep=0)
        if layer.self_attn.use_sliding_window
        else KVCache()
        for layer in inner.layers
    ]


def cohere2_head(text: Any, h: mx.array) -> mx.array:
    # Cohere's tied head scales the logits, as its own forward does.
    return text.model.embed_tokens.as_linear(h) * text.model.args.logit_scale


def lille_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Lille's forward up to the final norm: its own applies the tied head inside the inner
    model, which only the last rank (running the family's own forward) does."""
    h = inner.tok_embeddings(inputs)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    mask = create_attention_mask(h, caches[0])
    for layer, c in zip(inner.layers, caches, strict=True):
        h = layer(h, mask, cache=c)
    return inner.norm(h)


def phixtral_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    # Phixtral's outer model makes the mask (from the first cache) and passes it in.
    first = cache[0] if cache else None
    return inner(inputs, create_attention_mask(inputs, first), cache)


def kv_reuse_counts(counts: tuple[int, ...], n_regular: int) -> tuple[int, ...]:
    """The layer counts of a pipeline over a stack of `n_regular` regular layers followed by
    KV-reuse layers (AFM 7), which all attend over the KV cache of the LAST regular layer:
    that layer and every reuse layer must be on the last rank. Where `counts` puts the last
    rank's first layer past it, the boundary moves back to it, the layers coming from the
    ranks before (from the nearest one, each keeping one layer). Same counts on every rank,
    so the ranks agree without talking."""
    k, n = len(counts), sum(counts)
    source = n_regular - 1
    if k <= 1 or n - counts[-1] <= source:
        return counts
    if source < k - 1:
        raise ValueError(
            f"its KV-reuse layers read layer {source}'s cache, so that layer and the "
            f"{n - n_regular} reuse layers after it must be on the last rank; {k} ranks need "
            f"at least {k} regular layers, it has {n_regular}"
        )
    moved = list(counts)
    excess = n - counts[-1] - source
    moved[-1] += excess
    for i in range(k - 2, -1, -1):
        take = min(excess, moved[i] - 1)
        moved[i] -= take
        excess -= take
    return tuple(moved)
