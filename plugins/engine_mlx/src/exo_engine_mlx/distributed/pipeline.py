"""Pipeline parallel: each rank holds a contiguous run of layers and passes hidden states on.

Two ways, chosen by the model's class (`split_pipeline`):

* mlx-lm's own `pipeline()` (its `PipelineMixin`: DeepSeek V2/V3/V3.2, GLM 4 MoE, Qwen2,
  Qwen3 MoE, Qwen3-Next, Qwen3.5, Ministral 3, ...): the family's own forward pass, with its
  masks and caches (MoE, hybrid attention/SSM) as mlx-lm wrote them. mlx-lm gives rank 0 the
  *last* layers and every rank the final hidden state, so every rank computes the same logits.
* `PipelineStage` below, for llama-shaped models without the mixin.
* `SlicedStage` below, for the other families whose forward pass is a loop over their
  layers (gpt-oss, MiniMax, Step 3.5, Gemma 1-3, Nemotron-H): the family's own forward runs on
  this rank's slice of the layers, with the tokens' embedding replaced by the hidden state
  received from the rank before, and (before the last rank) the final norm left out. What
  differs per family (mask indices, an embedding scale, caches only in some layers, a forward
  that reads layer kinds by list position) is its `Slicing` in `SLICED_MODEL_TYPES`.

In a `PipelineStage`, rank 0 embeds the tokens and runs the first layers; every later rank receives the hidden state
from the rank before it; the last rank applies the final norm and the head. Only the last
rank has logits (of the last position only; the others return zeros of their shape): the
batch generator shares the tokens it samples from them with the group (`last_rank_sampling`,
distributed/sampled.py), a few bytes a sequence, so every rank stays in step.

Only the weights a rank runs are kept: the others are dropped while still lazy, so they are
never read from disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ChunkedKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from exo_engine_mlx.distributed import slicing_hybrid as hybrid
from exo_engine_mlx.distributed import slicing_state as state
from exo_engine_mlx.distributed import slicing_windows as windows
from exo_engine_mlx.distributed.sampled import LastRankSampling
from exo_engine_mlx.distributed.slicing_windows import kv_reuse_counts

# Model types whose inner model is embed_tokens -> layers(h, mask, cache) -> norm, with an
# lm_head or tied embeddings: the shape this stage re-implements.
PIPELINE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def _gpt_oss_indices(inner: Any) -> None:
    # The forward takes its full and sliding masks from the first cache of each kind.
    kinds = list(inner.layer_types)
    inner.ga_idx = kinds.index("full_attention") if "full_attention" in kinds else 0
    inner.swa_idx = kinds.index("sliding_attention") if "sliding_attention" in kinds else 0


def _afmoe_indices(inner: Any) -> None:
    kinds = list(inner.layer_types)
    inner.fa_idx = kinds.index("full_attention") if "full_attention" in kinds else 0
    inner.swa_idx = next((i for i, layer in enumerate(inner.layers) if layer.use_sliding), None)


def _step3p5_indices(inner: Any) -> None:
    sliding = [bool(layer.is_sliding) for layer in inner.layers]
    inner._swa_idx = sliding.index(True) if True in sliding else None
    inner._full_idx = sliding.index(False) if False in sliding else None
    inner.num_layers = len(inner.layers)


def _first(kinds: list[Any], kind: Any, missing: int | None = 0) -> int | None:
    """The index of the first layer of `kind` on this rank's slice. Where the slice has none,
    its mask is never used: `missing` (0, or None where the forward accepts it)."""
    return kinds.index(kind) if kind in kinds else missing


def _olmo3_indices(inner: Any) -> None:
    kinds = list(inner.layer_types)  # cut with the layers
    inner.swa_idx = _first(kinds, "sliding_attention")
    inner.ga_idx = _first(kinds, "full_attention")


def _mellum_indices(inner: Any) -> None:
    kinds = list(inner.args.layer_types)  # its forward reads the kinds from its (cut) args
    inner._first_full = _first(kinds, "full_attention")
    inner._first_sliding = _first(kinds, "sliding_attention", None)


def _spark2_5_indices(inner: Any) -> None:
    kinds = [bool(layer.is_sliding) for layer in inner.layers]
    inner._first_full = _first(kinds, False, None)
    inner._first_sliding = _first(kinds, True, None)


def _olmo_hybrid_indices(inner: Any) -> None:
    kinds = [type(layer).__name__ for layer in inner.layers]
    inner._fa_idx = _first(kinds, "FullAttentionDecoderLayer", None)
    inner._lin_idx = _first(kinds, "LinearAttentionDecoderLayer", None)


def _mimo_v2_flash_indices(inner: Any) -> None:
    kinds = [bool(layer.is_sliding_window) for layer in inner.layers]
    inner.swa_idx = _first(kinds, True)
    inner.ga_idx = _first(kinds, False)


def _plamo2_indices(inner: Any) -> None:
    # PLaMo keeps its layer list and mask indices in a decoder module. Its mask makers call
    # the cache they are given, so a kind this slice lacks points past its caches, at the
    # None `_plamo2_forward` adds (as for Nemotron-H).
    decoder = inner.layers
    kinds = [bool(layer.is_mamba) for layer in decoder.layers]
    if decoder.ssm_idx is not None:
        decoder.ssm_idx = _first(kinds, True, len(kinds))
    decoder.fa_idx = _first(kinds, False, len(kinds))


def _plamo2_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    caches = cache if cache is not None else [None] * len(inner.layers.layers)
    return inner(inputs, cache=[*caches, None])


def _plamo3_indices(inner: Any) -> None:
    decoder = inner.layers
    kinds = [bool(layer.full_attn) for layer in decoder.layers]
    decoder.full_idx = _first(kinds, True)
    decoder.swa_idx = _first(kinds, False, None)


def _nemotron_h_indices(inner: Any) -> None:
    # Only mamba ("M") and attention ("*") blocks hold a cache; the forward takes its masks
    # from the first cache of each kind, counted among the caches, not the layers. A slice
    # without one kind points past its caches, at the None `_nemotron_h_forward` adds.
    kinds = [layer.block_type for layer in inner.layers if layer.block_type in "M*"]
    inner.fa_idx = kinds.index("*") if "*" in kinds else len(kinds)
    inner.ssm_idx = kinds.index("M") if "M" in kinds else len(kinds)


def _nemotron_h_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    # The extra None: a mask for a kind of block this slice lacks is made without a cache
    # (and never used); the blocks take their caches in order, so never reach it.
    caches = cache if cache is not None else [None] * len(inner.layers)
    return inner(inputs, cache=[*caches, None])


def _gemma3_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Gemma 3's forward on a slice of its layers. Its own forward tells sliding from global
    layers by the position in the list, which a slice shifts; each attention block knows its
    kind from its index in the whole model (`is_sliding`), so that decides here."""
    h = inner.embed_tokens(inputs)
    h = h * mx.array(inner.args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
    sliding = [bool(layer.self_attn.is_sliding) for layer in inner.layers]
    return inner.norm(windows.windowed_layers(inner, h, cache, sliding))


def _gemma3_caches(inner: Any) -> list[Any]:
    return [
        RotatingKVCache(max_size=inner.window_size) if layer.self_attn.is_sliding else KVCache()
        for layer in inner.layers
    ]


def _llama4_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
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


def _llama4_caches(inner: Any) -> list[Any]:
    return [
        ChunkedKVCache(inner.attention_chunk_size) if layer.self_attn.use_rope else KVCache()
        for layer in inner.layers
    ]


def _muse_glimmer_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Muse Glimmer's forward on a slice: it normalises the embedding (no weight), which only
    the first rank does; a later rank's received state is already past that."""
    h = inner.embed_tokens(inputs)
    if not isinstance(inner.embed_tokens, _Received):
        h = mx.fast.rms_norm(h, None, inner.embed_eps)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    for layer, c, mask in zip(inner.layers, caches, inner._masks(h, caches), strict=True):
        h = layer(h, mask, c)
    return inner.norm(h)


def _muse_glimmer_head(text: Any, h: mx.array) -> mx.array:
    # Its head scales the logits and caps them softly, as its own forward does.
    out = text.model.embed_tokens.as_linear(h) if text.tie_word_embeddings else text.lm_head(h)
    cap = float(text.args.final_logit_softcapping)
    return mx.tanh(out * text.args.output_multiplier / cap) * cap


def _recurrent_gemma_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """RecurrentGemma's forward on a slice: the embedding scale applies on the first rank
    only; the local-attention mask comes from this slice's first attention block's cache."""
    x = inner.embed_tokens(inputs)
    if inner.scale_by_sqrt_dim and not isinstance(inner.embed_tokens, _Received):
        x = x * math.sqrt(x.shape[-1])
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    kinds = [layer.temporal_block_type for layer in inner.layers]
    window = next((c for c, k in zip(caches, kinds, strict=True) if k == "attention"), None)
    mask = create_attention_mask(x, window, window_size=inner.window_size)
    for layer, c in zip(inner.layers, caches, strict=True):
        x = layer(x, mask=mask, cache=c)
    return inner.final_norm(x)


def _recurrent_gemma_head(text: Any, h: mx.array) -> mx.array:
    logits = text.lm_head(h) if "lm_head" in text else text.model.embed_tokens.as_linear(h)
    cap = text.args.logits_soft_cap
    return mx.tanh(logits / cap) * cap if cap else logits


def _nanochat_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """nanochat's forward on a slice: its weightless RMS norms (functions, not modules) run
    after the embedding on the first rank and after the layers on the last one (the ranks
    before it have a dropped `norm`, which `SlicedStage` sets there)."""
    h = inner.wte(inputs)
    if not isinstance(inner.wte, _Received):
        h = _rms_norm(h)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.h)
    mask = create_attention_mask(h, caches[0])
    for layer, c in zip(inner.h, caches, strict=True):
        h = layer(h, mask=mask, cache=c)
    return h if isinstance(getattr(inner, "norm", None), _Dropped) else _rms_norm(h)


def _rms_norm(x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, 1e-5)  # nanochat's own, without weights


def _nanochat_head(text: Any, h: mx.array) -> mx.array:
    cap = 15.0  # nanochat caps its logits softly at 15
    return cap * mx.tanh(text.lm_head(h) / cap)


def _minicpm_head(text: Any, h: mx.array) -> mx.array:
    # MiniCPM divides the last hidden state by its width ratio before an untied head.
    args = text.args
    if args.tie_word_embeddings:
        return text.model.embed_tokens.as_linear(h)
    return text.lm_head(h / (args.hidden_size / args.dim_model_base))


def _gemma2_head(text: Any, h: mx.array) -> mx.array:
    # Gemma 2 caps its logits softly after the tied head, as its own forward does.
    cap = float(text.final_logit_softcapping)
    return mx.tanh(text.model.embed_tokens.as_linear(h) / cap) * cap


def _ssm_caches(inner: Any) -> list[Any]:
    # A conv state and an SSM state per layer (Mamba 2 counts all the model's layers).
    return [ArraysCache(size=2) for _ in inner.layers]


@dataclass(frozen=True)
class Slicing:
    """How `SlicedStage` cuts one family. By default the family's own inner forward runs on
    the rank's slice, one cache per layer, the head is its lm_head or tied embedding."""

    inner: str = "model"  # the text model's attribute holding the layer stack
    layers: str = "layers"  # the inner model's list of layers (Qwen 1: h; PLaMo: layers.layers)
    embedding: str = "embed_tokens"
    norm: str | None = "norm"  # None: the inner model has no final norm (Phixtral's is in its head)
    # After the cut: re-find the mask indices the inner forward reads (None: its masks come
    # from its first cache, right for any slice).
    reindex: Callable[[Any], None] | None = None
    # The inner forward multiplies the embedding by sqrt(args.hidden_size) (Gemma): a later
    # rank receives an already scaled hidden state, so it must see a scale of 1.
    scaled_embedding: bool = False
    # The args entry the inner forward multiplies the embedding by (MiniCPM's scale_emb): a
    # later rank sees 1 there, for the same reason.
    embedding_scale: str | None = None
    # Attributes of the inner model itself that scale the embedding (granite's embedding_multiplier):
    # a later rank receives an already scaled hidden state, so they are 1 there.
    embedding_scales: tuple[str, ...] = ()
    hidden_size: str = "hidden_size"  # the args entry of the hidden width (OpenELM: model_dim)
    vocab_size: str = "vocab_size"  # the args entry of the vocabulary size (Phixtral: num_vocab)
    # A learned position embedding the inner forward adds to the token embedding (GPT-2's
    # wpe): only the first rank adds it, at positions from its first cache's offset.
    positions: str | None = None
    # Modules of the inner model that make its head (GPT-NeoX's embed_out): dropped before
    # the last rank, where the family's own forward (`family_head`) runs them.
    inner_head: tuple[str, ...] = ()
    # A list of layers after `layers` that attend over the KV cache of the last of them
    # (AFM 7's kv_reuse_layers): the slice continues into it, and the split points are
    # moved so the last rank holds that layer and the whole list (`kv_reuse_counts`).
    reuse_layers: str | None = None
    forward: Callable[[Any, mx.array, list[Any] | None], mx.array] | None = None
    caches: Callable[[Any], list[Any]] | None = None  # this rank's caches, from its inner model
    caches_per_layer: bool = True  # False: only some layers hold a cache (Nemotron-H)
    head: Callable[[Any, mx.array], mx.array] | None = None  # (text model, last hidden) -> logits
    # The last rank runs the family's own model call (on its slice, the received hidden state
    # standing in for the embedding), so the head is the family's own: a logit scale or soft
    # cap included, which greedy tokens alone would not show.
    family_head: bool = False
    # (text model) -> the width of what a rank hands the next, where the forward packs more
    # than the hidden state (slicing_state: Talkie, RWKV-7, Gemma 3n/4); None: the hidden width.
    handoff: Callable[[Any], int] | None = None


_GEMMA = Slicing(scaled_embedding=True)
# The family's own forward and head on a slice of its layers, nothing else to adjust: proven
# per family by test_every_family_groups (2 ranks, layers 1 + 3, equal greedy tokens).
_OWN = Slicing(family_head=True)
_OWN_FAMILIES = (
    "apertus", "bitnet", "cohere", "deepseek", "dots1", "ernie4_5", "ernie4_5_moe", "glm", "glm4",
    "helium", "hunyuan", "hunyuan_v1_dense", "internlm3", "Klear", "llama4_text",
)  # fmt: skip
_OTHER_NAMES = {
    # AFMoE scales the embedding by sqrt(its hidden_size attribute, used for nothing else).
    "afmoe": Slicing(family_head=True, embedding_scales=("hidden_size",), reindex=_afmoe_indices),
    "gptj": Slicing(
        family_head=True, layers="h", embedding="wte", norm="ln_f", hidden_size="n_embd"
    ),
    "exaone": Slicing(
        family_head=True, inner="transformer", layers="h", embedding="wte", norm="ln_f"
    ),
    "dbrx": Slicing(
        family_head=True,
        inner="transformer",
        layers="blocks",
        embedding="wte",
        norm="norm_f",
        hidden_size="d_model",
    ),
    "granite": Slicing(family_head=True, embedding_scales=("embedding_multiplier",)),
    # Phi-3 Small scales the embedding by its mup_embedding_multiplier; its head (the tied
    # embedding over mup_width_multiplier, the dummy ids at -inf) is the family's own.
    "phi3small": Slicing(
        family_head=True, norm="final_layernorm", embedding_scales=("mup_embedding_multiplier",)
    ),
    "granitemoe": Slicing(family_head=True, embedding_scales=("embedding_multiplier",)),
    "bailing_moe": Slicing(family_head=True, embedding="word_embeddings"),
    "internlm2": Slicing(family_head=True, embedding="tok_embeddings"),
}
# GPT-2's layout: blocks in `h`, a learned position embedding `wpe` (first rank only).
_GPT2 = Slicing(
    family_head=True,
    layers="h",
    embedding="wte",
    norm="ln_f",
    hidden_size="n_embd",
    positions="wpe",
)
# Sliding-window patterns, position embeddings, heads inside the inner model, KV reuse
# (`slicing_windows`): each proven on 2 ranks by test_every_family_groups.
_WINDOWS_AND_POSITIONS = {
    "cohere2": Slicing(
        forward=windows.cohere2_forward, caches=windows.cohere2_caches, head=windows.cohere2_head
    ),
    "exaone4": Slicing(family_head=True, reindex=windows.exaone4_indices),
    "exaone_moe": Slicing(family_head=True, reindex=windows.exaone_moe_indices),
    "laguna": Slicing(family_head=True, reindex=windows.laguna_indices),
    # Gear scales the embedding by sqrt(width) (its embed_scale) and caps its logits softly.
    "gear": Slicing(
        family_head=True, reindex=windows.gear_indices, embedding_scales=("embed_scale",)
    ),
    "gpt2": _GPT2,
    "gpt_bigcode": replace(_GPT2, inner="transformer"),  # GPT-2's layout one level down
    "gpt_neox": Slicing(
        family_head=True,
        layers="h",
        embedding="embed_in",
        norm="final_layer_norm",
        inner_head=("embed_out",),
    ),
    "lille-130m": Slicing(
        family_head=True,
        inner="transformer",
        embedding="tok_embeddings",
        hidden_size="n_embd",
        forward=windows.lille_forward,
    ),
    "phixtral": Slicing(
        family_head=True,
        inner="transformer",
        layers="h",
        embedding="embd",
        norm=None,
        hidden_size="model_dim",
        vocab_size="num_vocab",
        forward=windows.phixtral_forward,
    ),
    "afm7": Slicing(
        family_head=True,
        embedding="embedding",
        norm="output_norm",
        hidden_size="hidden_dim",
        reuse_layers="kv_reuse_layers",
    ),
}
_GENERIC = Slicing()
_GEMMA4 = Slicing(
    reindex=state.gemma4_reindex,
    forward=state.gemma4_forward,
    caches=state.gemma4_caches,
    caches_per_layer=False,  # KV-shared layers hold none
    head=state.gemma4_head,
    handoff=state.gemma4_handoff,
)


def _hybrid(**how: Any) -> Slicing:
    # The None past the caches is added by our forward, which the family's own model call
    # would bypass: the head is the lm_head / tied embedding (these families do not scale it).
    return Slicing(forward=hybrid.none_past_caches, **how)


_SSM = Slicing(inner="backbone", embedding="embeddings", norm="norm_f", caches=_ssm_caches)
# Families `SlicedStage` splits, each proven on 2 ranks by test_every_family_groups.
SLICED_MODEL_TYPES: dict[str, Slicing] = {
    "gpt_oss": Slicing(reindex=_gpt_oss_indices),
    "minimax": Slicing(),
    "step3p5": Slicing(reindex=_step3p5_indices),
    "gemma": _GEMMA,
    "gemma2": Slicing(scaled_embedding=True, head=_gemma2_head),
    "gemma3_text": Slicing(scaled_embedding=True, forward=_gemma3_forward, caches=_gemma3_caches),
    "gemma3": Slicing(scaled_embedding=True, forward=_gemma3_forward, caches=_gemma3_caches),
    "nemotron_h": Slicing(
        inner="backbone",
        embedding="embeddings",
        norm="norm_f",
        reindex=_nemotron_h_indices,
        forward=_nemotron_h_forward,
        caches_per_layer=False,
    ),
    **{name: _OWN for name in _OWN_FAMILIES},
    **_OTHER_NAMES,
    **_WINDOWS_AND_POSITIONS,
    # The family's own forward unchanged on a slice (its masks come from its first cache).
    **{
        t: _GENERIC
        for t in (
            "mimo",
            "mixtral",
            "nanbeige",
            "nemotron",
            "olmo2",
            "olmoe",
            "phi3",
            "phimoe",
            "qwen2_moe",
            "seed_oss",
            "smollm3",
            "stablelm",
            "starcoder2",
            "telechat3",
            # Multimodal wrappers around a llama / qwen3 / (llama or ministral3) text model.
            "pixtral",
            "qwen3_vl",
            "mistral3",
        )
    },
    "phi": Slicing(norm="final_layernorm"),
    # Llama 4 (the multimodal wrapper; llama4_text is another module): chunked attention.
    "llama4": Slicing(forward=_llama4_forward, caches=_llama4_caches),
    "olmo3": Slicing(reindex=_olmo3_indices),
    "minicpm": Slicing(embedding_scale="scale_emb", head=_minicpm_head),
    "minicpm3": Slicing(embedding_scale="scale_emb", head=_minicpm_head),
    "nemotron-nas": Slicing(caches_per_layer=False),  # a no-op attention holds no cache
    "youtu_llm": _GENERIC,
    "muse_glimmer": Slicing(forward=_muse_glimmer_forward, head=_muse_glimmer_head),
    "recurrent_gemma": Slicing(
        norm="final_norm", forward=_recurrent_gemma_forward, head=_recurrent_gemma_head
    ),
    "plamo": Slicing(layers="layers.layers"),  # a decoder module holds PLaMo's layer list
    "plamo2": Slicing(layers="layers.layers", reindex=_plamo2_indices, forward=_plamo2_forward),
    "plamo3": Slicing(layers="layers.layers", reindex=_plamo3_indices),
    "nanochat": Slicing(
        inner="transformer",
        layers="h",
        embedding="wte",
        forward=_nanochat_forward,
        head=_nanochat_head,
    ),
    "qwen": Slicing(inner="transformer", layers="h", embedding="wte", norm="ln_f"),
    "openelm": Slicing(inner="transformer", embedding="token_embeddings", hidden_size="model_dim"),
    "mellum": Slicing(reindex=_mellum_indices),
    "spark2_5": Slicing(embedding="embedding", reindex=_spark2_5_indices),
    "olmo_hybrid": Slicing(reindex=_olmo_hybrid_indices),
    "mimo_v2_flash": Slicing(reindex=_mimo_v2_flash_indices),
    "mamba": _SSM,
    "mamba2": _SSM,
    **{
        # families8: layers that read more than the hidden state before them (slicing_state).
        "talkie": Slicing(
            layers="blocks",
            embedding="embed",
            forward=state.talkie_forward,
            head=state.talkie_head,
            handoff=state.twice_the_width,
        ),
        "rwkv7": Slicing(
            embedding="embeddings", forward=state.rwkv7_forward, handoff=state.twice_the_width
        ),
        "longcat_flash": Slicing(family_head=True),  # two attention blocks per layer
        "iquestloopcoder": Slicing(forward=state.loopcoder_forward, caches_per_layer=False),
        "longcat_flash_ngram": Slicing(
            embedding="ngram_embeddings",
            forward=state.longcat_ngram_forward,
            caches=state.longcat_ngram_caches,
            caches_per_layer=False,
        ),
        "gemma4": _GEMMA4,
        "gemma4_text": _GEMMA4,
        "gemma3n": Slicing(
            inner="model.language_model",
            reindex=state.gemma3n_reindex,
            forward=state.gemma3n_forward,
            caches=state.gemma3n_caches,
            caches_per_layer=False,
            head=state.gemma3n_head,
            handoff=state.gemma3n_handoff,
        ),
        # --- Hybrid attention + SSM / linear-attention stacks (`slicing_hybrid`). ---
        # The forward's mask indices re-found on the slice; a kind the slice lacks gets None
        # or an index past its caches (`none_past_caches`).
        "lfm2": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),
        "lfm2_moe": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),
        "lfm2-vl": _hybrid(norm="embedding_norm", reindex=hybrid.lfm2_indices),  # wraps lfm2
        "jamba": _hybrid(norm="final_layernorm", reindex=hybrid.jamba_indices),
        "kimi_linear": _hybrid(reindex=hybrid.kimi_linear_indices),
        # These forwards accept None for a kind the slice lacks: the family's own head runs.
        "granitemoehybrid": Slicing(
            family_head=True,
            embedding_scales=("embedding_multiplier",),
            reindex=hybrid.granitemoehybrid_indices,
        ),
        "bailing_moe_v3": Slicing(
            family_head=True, embedding="word_embeddings", reindex=hybrid.bailing_moe_v3_indices
        ),
        # Its own forward on the slice: positions from a global layer's cache or a cache
        # of its own (one more than the layers: `caches_per_layer=False`).
        "bailing_moe_linear": Slicing(
            embedding="word_embeddings",
            forward=hybrid.bailing_moe_linear_forward,
            caches=hybrid.bailing_moe_linear_caches,
            caches_per_layer=False,
        ),
        # Every layer holds a conv/SSM state and a KV cache together (a CacheList).
        "falcon_h1": Slicing(
            family_head=True, norm="final_layernorm", caches=hybrid.falcon_h1_caches
        ),
        "baichuan_m1": Slicing(
            family_head=True, reindex=hybrid.baichuan_m1_indices, caches=hybrid.baichuan_m1_caches
        ),
    },
}


class PipelineUnsupported(ValueError):
    """The model's family has no pipeline split here."""


# Where mlx-lm keeps the layer stack that carries its PipelineMixin, by model class.
_MIXIN_PATHS = (("model",), ("language_model", "model"), ("model", "language_model"))


def _mixin_part(model: nn.Module) -> Any:
    """The part of an mlx-lm model that splits itself (`pipeline()`), or None."""
    from mlx_lm.models.pipeline import PipelineMixin

    for path in _MIXIN_PATHS:
        part: Any = model
        for name in path:
            part = getattr(part, name, None)
        if isinstance(part, PipelineMixin):
            return part
    return None


def pipeline_method(model: nn.Module) -> str | None:
    """How this model splits into a pipeline: "mlx-lm" (its own `pipeline()`), "stage"
    (the engine's layer slicing) or None."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = str(getattr(model, "model_type", ""))
    if _mixin_part(model) is not None or model_type in hybrid.OWN_PIPELINE:
        return "mlx-lm"
    if MODEL_REMAPPING.get(model_type, model_type) in PIPELINE_MODEL_TYPES:
        return "stage"
    if MODEL_REMAPPING.get(model_type, model_type) in SLICED_MODEL_TYPES:
        return "sliced"
    return None


def split_pipeline(
    model: nn.Module,
    start: int,
    end: int,
    counts: tuple[int, ...],
    group: mx.distributed.Group,
) -> nn.Module:
    """This rank's part of `model` for a pipeline over `group`: [start, end) of its layers,
    or, where mlx-lm splits the model itself, as many layers as the placement gave this rank
    (mlx-lm orders the blocks from the last rank to the first)."""
    own = hybrid.OWN_PIPELINE.get(str(getattr(model, "model_type", "")))
    if own is not None:
        own(model, group, list(counts))
        return model
    inner = _mixin_part(model)
    if inner is not None:
        if len(counts) != group.size() or sum(counts) != len(inner.layers):
            raise ValueError(f"layer counts {list(counts)} do not cover the model for the group")
        inner.pipeline(group, list(counts))
        text = getattr(model, "language_model", None)
        if text is not None and not hasattr(model, "make_cache"):
            # A multimodal wrapper's `layers` is the stack's own list, where mlx-lm left None
            # for the other ranks' layers (or it has none: Kimi VL): its caches follow the text
            # model's, or this rank's layers (plain KV caches, as make_prompt_cache makes).
            if hasattr(text, "layers") or hasattr(text, "make_cache"):
                model.make_cache = partial(make_prompt_cache, text)
            else:
                model.make_cache = lambda: [KVCache() for _ in inner.pipeline_layers]
        return model
    if pipeline_method(model) == "sliced":
        return SlicedStage(model, start, end, group, tuple(counts))
    return PipelineStage(model, start, end, group)


def _float_dtype(module: nn.Module) -> mx.Dtype:
    """The dtype of the module's first floating-point parameter (not packed quantized ints, nor
    a quantized layer's scales and biases: the CPU kernels keep those in the narrowest exact
    dtype, float16 for a GGUF's, while the hidden state stays in the model's own).

    The hidden state between layers has this dtype; reading it from a rank's own layers keeps
    every rank agreeing once each has converted its weights the same way (e.g. to float32)."""
    for name, value in tree_flatten(module.parameters()):
        if name.rsplit(".", 1)[-1] in ("scales", "biases"):
            continue
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return value.dtype
    raise ValueError("the layer has no floating-point parameter to take the hidden dtype from")


class PipelineStage(nn.Module):
    """One rank's part of a llama-like model, callable like the whole model."""

    def __init__(
        self,
        model: nn.Module,
        start: int,
        end: int,
        group: mx.distributed.Group,
    ) -> None:
        super().__init__()
        model_type = str(getattr(model, "model_type", ""))
        if pipeline_method(model) is None:
            raise PipelineUnsupported(
                f"pipeline parallel does not support model type '{model_type}' "
                "(see the engine's README for the architectures it splits)"
            )
        full: Any = model  # a model class of mlx-lm: typed by duck, checked above
        inner = full.model
        n_layers = len(inner.layers)
        if not 0 <= start < end <= n_layers:
            raise ValueError(f"layers [{start}, {end}) are not within the model's {n_layers}")
        self._rank = group.rank()
        self._size = group.size()
        self._group = group
        self.first = self._rank == 0
        self.last = self._rank == self._size - 1
        tied = not hasattr(model, "lm_head")
        args = full.args
        self._hidden_size = int(args.hidden_size)
        self._vocab_size = int(args.vocab_size)
        self.sliding_window = getattr(inner, "sliding_window", None)
        self.layers = list(inner.layers[start:end])
        # The embedding is kept where tokens come in, and where it doubles as the head.
        if self.first or (self.last and tied):
            self.embed_tokens = inner.embed_tokens
        if self.last:
            self.norm = inner.norm
            if not tied:
                self.lm_head = full.lm_head
        self._tied = tied
        self.last_rank_sampling = LastRankSampling(group, self.last)

    @property
    def group(self) -> mx.distributed.Group:
        return self._group

    def make_cache(self) -> list[Any]:
        return [
            RotatingKVCache(max_size=self.sliding_window)
            if getattr(layer, "use_sliding", False) and self.sliding_window
            else KVCache()
            for layer in self.layers
        ]

    def _masks(self, h: mx.array, cache: list[Any]) -> tuple[Any, Any]:
        full = next(
            (c for c, layer in zip(cache, self.layers, strict=True)
             if not getattr(layer, "use_sliding", False)),
            None,
        )  # fmt: skip
        sliding = next(
            (c for c, layer in zip(cache, self.layers, strict=True)
             if getattr(layer, "use_sliding", False)),
            None,
        )  # fmt: skip
        full_mask = create_attention_mask(h, full)
        sliding_mask = (
            create_attention_mask(h, sliding, window_size=self.sliding_window)
            if any(getattr(layer, "use_sliding", False) for layer in self.layers)
            else None
        )
        return full_mask, sliding_mask

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        batch, length = inputs.shape[0], inputs.shape[1]
        dtype = _float_dtype(self.layers[0])
        if self.first:
            h = self.embed_tokens(inputs).astype(dtype)
        else:
            template = mx.zeros((batch, length, self._hidden_size), dtype=dtype)
            h = mx.distributed.recv_like(template, self._rank - 1, group=self._group)
        layer_cache: list[Any] = cache if cache is not None else [None] * len(self.layers)
        full_mask, sliding_mask = self._masks(h, layer_cache)
        for layer, c in zip(self.layers, layer_cache, strict=True):
            mask = sliding_mask if getattr(layer, "use_sliding", False) else full_mask
            h = layer(h, mask, cache=c)
        if self.last:
            out = self.norm(h[:, -1:, :])
            logits = self.embed_tokens.as_linear(out) if self._tied else self.lm_head(out)
            # float32, as the one-rank path samples from.
            return logits.astype(mx.float32)
        sent = mx.distributed.send(h, self._rank + 1, group=self._group)
        # A prefill step evaluates only the caches: make them carry the send.
        if cache is not None and cache[-1] is not None and cache[-1].keys is not None:
            cache[-1].keys = mx.depends(cache[-1].keys, sent)
        # No logits here: zeros of their shape, after the send (the tokens come shared).
        return mx.depends(mx.zeros((batch, 1, self._vocab_size), dtype=mx.float32), sent)


class _Received(nn.Module):
    """Stands in for the embedding on a rank after the first: "embedding" the tokens gives the
    hidden state the rank before sent. Keeps the real embedding only where it is also the
    head (tied weights on the last rank)."""

    def __init__(self, receive: Callable[[mx.array], mx.array], head: nn.Module | None) -> None:
        super().__init__()
        self._receive = receive  # a method, not a child module: no cycle in the tree
        if head is not None:
            self.head = head

    def __call__(self, inputs: mx.array) -> mx.array:
        return self._receive(inputs)

    def as_linear(self, x: mx.array) -> mx.array:
        head: Any = self.head  # an embedding (typed by duck: mlx's stubs lack as_linear)
        return head.as_linear(x)


class _NoPositions(nn.Module):
    """A learned position embedding on a rank after the first: the received hidden state
    already has the positions added, so this adds nothing (a Python 0 keeps its dtype)."""

    def __call__(self, positions: mx.array) -> float:
        return 0.0


class _Dropped(nn.Module):
    """A part this rank never runs (the head before the last rank): no weights kept."""

    def __call__(self, x: mx.array) -> mx.array:
        return x


def _carry(cache: list[Any] | None, sent: mx.array) -> None:
    """Make this rank's caches carry the send: a prefill step evaluates only the caches."""
    for entry in reversed(cache or []):
        # A CacheList (Falcon-H1, Baichuan M1: a conv state and a KV cache per layer): its KV part.
        c = entry.caches[-1] if isinstance(entry, CacheList) else entry
        if isinstance(c, ArraysCache):
            if c[0] is not None:  # an SSM state
                c[0] = mx.depends(c[0], sent)
                return
        elif getattr(c, "keys", None) is not None:  # a KV cache, plain or rotating
            kv: Any = c
            kv.keys = mx.depends(kv.keys, sent)
            return


def _attribute(module: Any, path: str) -> Any:
    """The attribute at a dotted `path` ("model", "model.language_model")."""
    for name in path.split("."):
        module = getattr(module, name)
    return module


def _layer_list(inner: Any, path: str) -> tuple[Any, str]:
    """The module holding the layer list at `path` ("layers", "h", "layers.layers"), and
    the list's name in it."""
    *parents, name = path.split(".")
    for parent in parents:
        inner = getattr(inner, parent)
    return inner, name


def _cut_per_layer_args(parts: tuple[Any, ...], n_layers: int, start: int, end: int) -> None:
    """Give the model and its inner model a copy of their args whose per-layer lists (layer
    kinds) are cut like the layers: `make_cache` and some forwards read them (Mellum, OLMo
    hybrid, MiMo V2)."""
    copies: dict[int, Any] = {}
    for part in parts:
        args = getattr(part, "args", None)
        if args is None or not hasattr(args, "__dict__"):
            continue
        if id(args) not in copies:
            cut = copy(args)
            for name, value in vars(args).items():
                if isinstance(value, list) and len(value) == n_layers:
                    setattr(cut, name, value[start:end])
            copies[id(args)] = cut
        part.args = copies[id(args)]


class SlicedStage(nn.Module):
    """One rank's part of a family in `SLICED_MODEL_TYPES`: the family's own model, cut to
    layers [start, end), callable like the whole model."""

    def __init__(
        self,
        model: nn.Module,
        start: int,
        end: int,
        group: mx.distributed.Group,
        counts: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        from mlx_lm.utils import MODEL_REMAPPING

        model_type = str(getattr(model, "model_type", ""))
        self._slicing = how = SLICED_MODEL_TYPES[MODEL_REMAPPING.get(model_type, model_type)]
        # A model class of mlx-lm, typed by duck (checked by the caller); a multimodal wrapper
        # (Gemma 3) keeps the text model as `language_model`.
        text: Any = getattr(model, "language_model", model)
        inner = _attribute(text, how.inner)
        owner, name = _layer_list(inner, how.layers)
        reused: list[Any] = list(inner[how.reuse_layers]) if how.reuse_layers else []
        n_regular = len(owner[name])
        n_layers = n_regular + len(reused)
        if not 0 <= start < end <= n_layers:
            raise ValueError(f"layers [{start}, {end}) are not within the model's {n_layers}")
        self._rank, self._size, self._group = group.rank(), group.size(), group
        if how.reuse_layers and len(counts) == group.size() and sum(counts) == n_layers:
            try:
                moved = kv_reuse_counts(counts, n_regular)
            except ValueError as e:
                raise PipelineUnsupported(f"{model_type}: {e}") from e
            start = sum(moved[: self._rank])
            end = start + moved[self._rank]
        # With reuse layers, a rank holds either regular layers before the source (the last
        # regular one) or the source and everything after it.
        holds_source = start <= n_regular - 1 and end == n_layers
        if reused and not holds_source and end > n_regular - 1:
            raise PipelineUnsupported(
                f"{model_type}: layers [{start}, {end}) part its KV-reuse layers from the "
                f"cache of layer {n_regular - 1} they read"
            )
        self.first, self.last = self._rank == 0, self._rank == group.size() - 1
        # baichuan_m1's and Youtu-LLM's models keep their args as `config`
        args = getattr(text, "args", None) or getattr(text, "config", None) or inner.args
        self._hidden_size = (
            how.handoff(text) if how.handoff is not None else int(getattr(args, how.hidden_size))
        )
        # Gemma 3n's args (the wrapper's) have no vocabulary size; its inner model has.
        self._vocab_size = int(getattr(args, how.vocab_size, None) or inner.vocab_size)
        # Every per-layer list of the inner model (layer kinds) is cut like the layers.
        # (An mlx module keeps list attributes as its dict's items.)
        layers = owner[name]
        for key, value in list(inner.items()):
            if isinstance(value, list) and len(value) == n_layers and value is not layers:
                inner[key] = value[start:end]
        owner[name] = layers[start : min(end, n_regular)]
        if how.reuse_layers:
            inner[how.reuse_layers] = reused[max(start - n_regular, 0) : max(end - n_regular, 0)]
        _cut_per_layer_args((text, inner), n_layers, start, end)
        inner.exo_span = state.Span(start, end, n_layers)  # for forwards that ask (slicing_state)
        inner.exo_hop = self.hop
        if how.reindex is not None:
            how.reindex(inner)
        tied = not hasattr(text, "lm_head") and not how.inner_head
        if not self.first:
            head = getattr(inner, how.embedding) if self.last and tied else None
            setattr(inner, how.embedding, _Received(self.receive, head))
            if how.scaled_embedding:
                inner.args = replace(inner.args, hidden_size=1)
            for attr in how.embedding_scales:
                setattr(inner, attr, 1.0)
            if how.embedding_scale is not None:
                inner.args = copy(inner.args)
                setattr(inner.args, how.embedding_scale, 1.0)
            if how.positions is not None:
                setattr(inner, how.positions, _NoPositions())
        if not self.last:
            if how.norm is not None:
                setattr(inner, how.norm, _Dropped())
            for attr in how.inner_head:
                setattr(inner, attr, _Dropped())
            if not tied:
                text.lm_head = _Dropped()
        self.model = model
        self._tied = tied
        self.last_rank_sampling = LastRankSampling(group, self.last)
        caches = self.make_cache()
        if how.caches_per_layer and len(caches) != len(self.layers):
            raise PipelineUnsupported(f"{model_type}: its caches do not follow its layers")
        if not caches:  # the send rides on a cache
            raise PipelineUnsupported(
                f"{model_type}: layers [{start}, {end}) hold no cache; give this rank more layers"
            )

    @property
    def group(self) -> mx.distributed.Group:
        return self._group

    @property
    def _text(self) -> Any:
        return getattr(self.model, "language_model", self.model)

    @property
    def _inner(self) -> Any:
        return _attribute(self._text, self._slicing.inner)

    @property
    def layers(self) -> list[Any]:
        owner, name = _layer_list(self._inner, self._slicing.layers)
        return owner[name]

    def make_cache(self) -> list[Any]:
        if self._slicing.caches is not None:
            return self._slicing.caches(self._inner)
        own = getattr(self.model, "make_cache", None)
        return own() if own is not None else [KVCache() for _ in self.layers]

    def receive(self, inputs: mx.array) -> mx.array:
        shape = (inputs.shape[0], inputs.shape[1], self._hidden_size)
        template = mx.zeros(shape, dtype=_float_dtype(self.layers[0]))
        return mx.distributed.recv_like(template, self._rank - 1, group=self._group)

    def hop(self, h: mx.array) -> mx.array:
        """Hand `h` once round the ring, for a family whose forward runs its stack twice: to
        the next rank (the last one's to the first), and return what the rank before (the
        first one's: the last) handed on. The send is evaluated here, before the receive is
        made: a receive has no inputs to order it by, and the first rank's receive, run
        first, would wait for a last rank that waits for the first rank's send."""
        dtype = _float_dtype(self.layers[0])
        to, source = (self._rank + 1) % self._size, (self._rank - 1) % self._size
        mx.eval(mx.distributed.send(h.astype(dtype), to, group=self._group))
        return mx.distributed.recv_like(h.astype(dtype), source, group=self._group)

    def _logits(self, h: mx.array) -> mx.array:
        """The head as the family's own forward applies it."""
        if self._slicing.head is not None:
            return self._slicing.head(self._text, h)
        if self._tied:
            return getattr(self._inner, self._slicing.embedding).as_linear(h)
        return self._text.lm_head(h)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        forward = self._slicing.forward
        inner = self._inner
        if self.last and self._slicing.family_head:
            return self._text(inputs, cache=cache)[:, -1:, :].astype(mx.float32)
        h = forward(inner, inputs, cache) if forward is not None else inner(inputs, cache=cache)
        if self.last:
            return self._logits(h[:, -1:, :]).astype(mx.float32)
        h = h.astype(_float_dtype(self.layers[0]))
        sent = mx.distributed.send(h, self._rank + 1, group=self._group)
        _carry(cache, sent)
        # No logits here: zeros of their shape, after the send (the tokens come shared).
        batch = inputs.shape[0]
        return mx.depends(mx.zeros((batch, 1, self._vocab_size), dtype=mx.float32), sent)
