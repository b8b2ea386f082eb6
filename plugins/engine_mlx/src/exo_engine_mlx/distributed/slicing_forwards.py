"""The short per-family pieces a `Slicing` names (slicing_families.py): mask indices re-found
on a slice of the layers, a forward pass over the slice, a head, the caches a slice makes."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import (
    ArraysCache,
    ChunkedKVCache,
    KVCache,
    RotatingKVCache,
)

from exo_engine_mlx.distributed import slicing_windows as windows
from exo_engine_mlx.distributed.stand_ins import Dropped, Received


def gpt_oss_indices(inner: Any) -> None:
    # The forward takes its full and sliding masks from the first cache of each kind.
    kinds = list(inner.layer_types)
    inner.ga_idx = kinds.index("full_attention") if "full_attention" in kinds else 0
    inner.swa_idx = kinds.index("sliding_attention") if "sliding_attention" in kinds else 0


def afmoe_indices(inner: Any) -> None:
    kinds = list(inner.layer_types)
    inner.fa_idx = kinds.index("full_attention") if "full_attention" in kinds else 0
    inner.swa_idx = next((i for i, layer in enumerate(inner.layers) if layer.use_sliding), None)


def step3p5_indices(inner: Any) -> None:
    sliding = [bool(layer.is_sliding) for layer in inner.layers]
    inner._swa_idx = sliding.index(True) if True in sliding else None
    inner._full_idx = sliding.index(False) if False in sliding else None
    inner.num_layers = len(inner.layers)


def _first(kinds: list[Any], kind: Any, missing: int | None = 0) -> int | None:
    """The index of the first layer of `kind` on this rank's slice. Where the slice has none,
    its mask is never used: `missing` (0, or None where the forward accepts it)."""
    return kinds.index(kind) if kind in kinds else missing


def olmo3_indices(inner: Any) -> None:
    kinds = list(inner.layer_types)  # cut with the layers
    inner.swa_idx = _first(kinds, "sliding_attention")
    inner.ga_idx = _first(kinds, "full_attention")


def mellum_indices(inner: Any) -> None:
    kinds = list(inner.args.layer_types)  # its forward reads the kinds from its (cut) args
    inner._first_full = _first(kinds, "full_attention")
    inner._first_sliding = _first(kinds, "sliding_attention", None)


def spark2_5_indices(inner: Any) -> None:
    kinds = [bool(layer.is_sliding) for layer in inner.layers]
    inner._first_full = _first(kinds, False, None)
    inner._first_sliding = _first(kinds, True, None)


def olmo_hybrid_indices(inner: Any) -> None:
    kinds = [type(layer).__name__ for layer in inner.layers]
    inner._fa_idx = _first(kinds, "FullAttentionDecoderLayer", None)
    inner._lin_idx = _first(kinds, "LinearAttentionDecoderLayer", None)


def mimo_v2_flash_indices(inner: Any) -> None:
    kinds = [bool(layer.is_sliding_window) for layer in inner.layers]
    inner.swa_idx = _first(kinds, True)
    inner.ga_idx = _first(kinds, False)


def plamo2_indices(inner: Any) -> None:
    # PLaMo keeps its layer list and mask indices in a decoder module. Its mask makers call
    # the cache they are given, so a kind this slice lacks points past its caches, at the
    # None `plamo2_forward` adds (as for Nemotron-H).
    decoder = inner.layers
    kinds = [bool(layer.is_mamba) for layer in decoder.layers]
    if decoder.ssm_idx is not None:
        decoder.ssm_idx = _first(kinds, True, len(kinds))
    decoder.fa_idx = _first(kinds, False, len(kinds))


def plamo2_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    caches = cache if cache is not None else [None] * len(inner.layers.layers)
    return inner(inputs, cache=[*caches, None])


def plamo3_indices(inner: Any) -> None:
    decoder = inner.layers
    kinds = [bool(layer.full_attn) for layer in decoder.layers]
    decoder.full_idx = _first(kinds, True)
    decoder.swa_idx = _first(kinds, False, None)


def nemotron_h_indices(inner: Any) -> None:
    # Only mamba ("M") and attention ("*") blocks hold a cache; the forward takes its masks
    # from the first cache of each kind, counted among the caches, not the layers. A slice
    # without one kind points past its caches, at the None `nemotron_h_forward` adds.
    kinds = [layer.block_type for layer in inner.layers if layer.block_type in "M*"]
    inner.fa_idx = kinds.index("*") if "*" in kinds else len(kinds)
    inner.ssm_idx = kinds.index("M") if "M" in kinds else len(kinds)


def nemotron_h_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    # The extra None: a mask for a kind of block this slice lacks is made without a cache
    # (and never used); the blocks take their caches in order, so never reach it.
    caches = cache if cache is not None else [None] * len(inner.layers)
    return inner(inputs, cache=[*caches, None])


def gemma3_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Gemma 3's forward on a slice of its layers. Its own forward tells sliding from global
    layers by the position in the list, which a slice shifts; each attention block knows its
    kind from its index in the whole model (`is_sliding`), so that decides here."""
    h = inner.embed_tokens(inputs)
    h = h * mx.array(inner.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
    sliding = [bool(layer.self_attn.is_sliding) for layer in inner.layers]
    return inner.norm(windows.windowed_layers(inner, h, cache, sliding))


def gemma3_caches(inner: Any) -> list[Any]:
    return [
        RotatingKVCache(max_size=inner.window_size) if layer.self_attn.is_sliding else KVCache()
        for layer in inner.layers
    ]


def llama4_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Llama 4's forward on a slice of its layers. Its own tells chunked-attention layers from
    global ones (every fourth) by the position in the list and takes the global mask from the
    fourth cache, which a slice shifts; each attention block knows its kind from its index in
    the whole model (`use_rope`: only chunked layers rotate), so that decides here."""
    h = inner.embed_tokens(inputs)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    chunked = [bool(layer.self_attn.use_rope) for layer in inner.layers]
    for c, k in zip(caches, chunked, strict=True):
        if k and c is not None:
            c.maybe_trim_front()  # a chunked cache keeps only the current chunk's reach
    chunk_cache = next((c for c, k in zip(caches, chunked, strict=True) if k), None)
    global_cache = next((c for c, k in zip(caches, chunked, strict=True) if not k), None)
    offset = caches[0].offset if caches[0] is not None else 0
    start = chunk_cache.start_position if chunk_cache is not None else offset
    # Chunked attention: a query sees the keys of its own chunk up to itself.
    size = inner.attention_chunk_size
    keys = mx.arange(start, offset + h.shape[1])
    queries = mx.arange(offset, offset + h.shape[1])[:, None]
    chunk_mask = (keys // size == queries // size) & (keys <= queries)
    global_mask = create_attention_mask(h, global_cache)
    for layer, c, k in zip(inner.layers, caches, chunked, strict=True):
        h = layer(h, chunk_mask if k else global_mask, cache=c)
    return inner.norm(h)


def llama4_caches(inner: Any) -> list[Any]:
    return [
        ChunkedKVCache(inner.attention_chunk_size) if layer.self_attn.use_rope else KVCache()
        for layer in inner.layers
    ]


def muse_glimmer_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Muse Glimmer's forward on a slice: it normalises the embedding (no weight), which only
    the first rank does; a later rank's received state is already past that."""
    h = inner.embed_tokens(inputs)
    if not isinstance(inner.embed_tokens, Received):
        h = mx.fast.rms_norm(h, None, inner.embed_eps)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    for layer, c, mask in zip(inner.layers, caches, inner._masks(h, caches), strict=True):
        h = layer(h, mask, c)
    return inner.norm(h)


def muse_glimmer_head(text: Any, h: mx.array) -> mx.array:
    # Its head scales the logits and caps them softly, as its own forward does.
    out = text.model.embed_tokens.as_linear(h) if text.tie_word_embeddings else text.lm_head(h)
    cap = float(text.args.final_logit_softcapping)
    return mx.tanh(out * text.args.output_multiplier / cap) * cap


def recurrent_gemma_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """RecurrentGemma's forward on a slice: the embedding scale applies on the first rank
    only; the local-attention mask comes from this slice's first attention block's cache."""
    x = inner.embed_tokens(inputs)
    if inner.scale_by_sqrt_dim and not isinstance(inner.embed_tokens, Received):
        x = x * math.sqrt(x.shape[-1])
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    kinds = [layer.temporal_block_type for layer in inner.layers]
    window = next((c for c, k in zip(caches, kinds, strict=True) if k == "attention"), None)
    mask = create_attention_mask(x, window, window_size=inner.window_size)
    for layer, c in zip(inner.layers, caches, strict=True):
        x = layer(x, mask=mask, cache=c)
    return inner.final_norm(x)


def recurrent_gemma_head(text: Any, h: mx.array) -> mx.array:
    logits = text.lm_head(h) if "lm_head" in text else text.model.embed_tokens.as_linear(h)
    cap = text.args.logits_soft_cap
    return mx.tanh(logits / cap) * cap if cap else logits


def nanochat_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """nanochat's forward on a slice: its weightless RMS norms (functions, not modules) run
    after the embedding on the first rank and after the layers on the last one (the ranks
    before it have a dropped `norm`, which `SlicedStage` sets there)."""
    h = inner.wte(inputs)
    if not isinstance(inner.wte, Received):
        h = _rms_norm(h)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.h)
    mask = create_attention_mask(h, caches[0])
    for layer, c in zip(inner.h, caches, strict=True):
        h = layer(h, mask=mask, cache=c)
    return h if isinstance(getattr(inner, "norm", None), Dropped) else _rms_norm(h)


def _rms_norm(x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, 1e-5)  # nanochat's own, without weights


def nanochat_head(text: Any, h: mx.array) -> mx.array:
    cap = 15.0  # nanochat caps its logits softly at 15
    return cap * mx.tanh(text.lm_head(h) / cap)


def minicpm_head(text: Any, h: mx.array) -> mx.array:
    # MiniCPM divides the last hidden state by its width ratio before an untied head.
    args = text.args
    if args.tie_word_embeddings:
        return text.model.embed_tokens.as_linear(h)
    return text.lm_head(h / (args.hidden_size / args.dim_model_base))


def gemma2_head(text: Any, h: mx.array) -> mx.array:
    # Gemma 2 caps its logits softly after the tied head, as its own forward does.
    cap = float(text.final_logit_softcapping)
    return mx.tanh(text.model.embed_tokens.as_linear(h) / cap) * cap


def ssm_caches(inner: Any) -> list[Any]:
    # A conv state and an SSM state per layer (Mamba 2 counts all the model's layers).
    return [ArraysCache(size=2) for _ in inner.layers]
