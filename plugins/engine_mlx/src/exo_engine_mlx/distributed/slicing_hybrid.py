"""What `SlicedStage` adjusts for the hybrid stacks: attention layers mixed with SSM (Mamba)
or linear-attention layers (Jamba, Falcon-H1, Granite 4 hybrid, LFM2, Kimi Linear, Bailing
V3, Baichuan M1). Their specs are in `slicing_families.SLICED_MODEL_TYPES`.

Each of these forwards builds one attention mask and one SSM mask from "the first cache of
that kind", found by its index in the WHOLE model's list; on a slice the index must be
re-found among the slice's own layers. A slice may lack one kind: families whose forward
accepts None there get None; the others get an index one past the slice's caches, where
`none_past_caches` puts a None (the mask is then made without a cache and never used; the
layers take their caches in order, so never reach it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache


def _first(flags: list[bool], missing: int | None) -> int | None:
    """The position of the first True on the slice, or `missing`."""
    return flags.index(True) if True in flags else missing


def none_past_caches(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """The family's own forward, with a None after this slice's caches (see the module)."""
    caches = cache if cache is not None else [None] * len(inner.layers)
    return inner(inputs, cache=[*caches, None])


def reindex(
    attention: tuple[str, Callable[[Any], bool]],
    recurrent: tuple[str, Callable[[Any], bool]],
    missing: str = "past",
) -> Callable[[Any], None]:
    """A `Slicing.reindex` that sets the inner model's attention-mask index and its SSM-mask
    index (attribute names) to the slice's first layer of each kind. `missing`: "past" (one
    past the caches, with `none_past_caches`) or "none" (the forward accepts None)."""

    def apply(inner: Any) -> None:
        layers = list(inner.layers)
        absent = len(layers) if missing == "past" else None
        for attr, is_kind in (attention, recurrent):
            setattr(inner, attr, _first([bool(is_kind(layer)) for layer in layers], absent))

    return apply


def _is_linear(layer: Any) -> bool:
    return bool(layer.is_linear)


def _is_attention(layer: Any) -> bool:
    return not layer.is_linear


# LFM2 (and LFM2-MoE, LFM2-VL's text model): fa_idx / conv_idx, short-conv layers.
lfm2_indices = reindex(
    ("fa_idx", lambda layer: layer.is_attention_layer),
    ("conv_idx", lambda layer: not layer.is_attention_layer),
)
jamba_indices = reindex(
    ("attn_idx", lambda layer: layer.is_attn), ("ssm_idx", lambda layer: not layer.is_attn)
)
kimi_linear_indices = reindex(("attn_idx", _is_attention), ("ssm_idx", _is_linear))
granitemoehybrid_indices = reindex(
    ("fa_idx", lambda layer: layer.layer_type == "attention"),
    ("ssm_idx", lambda layer: layer.layer_type == "mamba"),
    missing="none",
)
bailing_moe_v3_indices = reindex(
    ("attention_index", _is_attention), ("linear_index", _is_linear), missing="none"
)


def falcon_h1_caches(inner: Any) -> list[Any]:
    # Every Falcon-H1 layer runs attention and Mamba side by side; mlx-lm's make_cache counts
    # the whole model's layers, so this rank's are made here.
    return [CacheList(ArraysCache(size=2), KVCache()) for _ in inner.layers]


def baichuan_m1_indices(inner: Any) -> None:
    """Baichuan M1's forward tells sliding-window layers by their position in the list (a set
    of whole-model indices); each attention block knows its own kind (`is_swa`)."""
    sliding = [bool(layer.self_attn.is_swa) for layer in inner.layers]
    inner.swa_layers = {i for i, s in enumerate(sliding) if s}
    inner.first_swa_idx = _first(sliding, None)
    inner.first_global_idx = _first([not s for s in sliding], None)


def baichuan_m1_caches(inner: Any) -> list[Any]:
    # A conv state and a KV cache (rotating in sliding-window layers) per layer; mlx-lm's
    # make_cache reads the kinds by whole-model index.
    return [
        CacheList(
            ArraysCache(size=2),
            RotatingKVCache(max_size=inner.sliding_window) if layer.self_attn.is_swa else KVCache(),
        )
        for layer in inner.layers
    ]


# -- Bailing linear (Ling 2 linear): positions for a slice without a global-attention layer -----


def _has_global(inner: Any) -> bool:
    return any(layer.is_global for layer in inner.layers)


def bailing_moe_linear_caches(inner: Any) -> list[Any]:
    """Its linear-attention (GLA) layers rotate queries and keys by the position, which the
    whole model reads from its first global-attention layer's KV cache. A slice without one
    gets one more KV cache after its layers' that only counts positions (one head of width
    one: it grows by a few bytes a token, and batches, pads and trims as the others do)."""
    caches: list[Any] = [
        KVCache() if layer.is_global else ArraysCache(size=1) for layer in inner.layers
    ]
    return caches if _has_global(inner) else [*caches, KVCache()]


def bailing_moe_linear_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    """Bailing linear's forward on a slice: masks and the position offset from the slice's
    first layer of each kind, or from its position-only cache."""
    from mlx_lm.models.base import create_attention_mask, create_ssm_mask

    h = inner.word_embeddings(inputs)
    n = len(inner.layers)
    caches: list[Any] = list(cache) if cache is not None else [None] * n
    kinds = [bool(layer.is_global) for layer in inner.layers]
    attention = next((c for c, g in zip(caches, kinds, strict=False) if g), None)
    linear = next((c for c, g in zip(caches, kinds, strict=False) if not g), None)
    positions = attention if any(kinds) else (caches[n] if len(caches) > n else None)
    offset = positions.offset if positions is not None else 0
    if positions is not None and not any(kinds):
        batch, length = h.shape[0], h.shape[1]
        mark = mx.zeros((batch, 1, length, 1), dtype=h.dtype)
        positions.update_and_fetch(mark, mark)  # counts this step's tokens
    attention_mask = create_attention_mask(h, attention)
    linear_mask = create_ssm_mask(h, linear)
    for layer, c, is_global in zip(inner.layers, caches[:n], kinds, strict=True):
        h = layer(h, attention_mask if is_global else linear_mask, c, offset=offset)
    return inner.norm(h)


# -- which layers hold a cache, from config.json (for placement) ------------------------------
# In these families only some layers hold a cache (`Slicing.caches_per_layer=False`); a
# pipeline rank needs one, since the hidden state it sends rides on its caches
# (`SlicedStage` refuses at load a rank whose layers hold none).


def _nemotron_h_cache_layers(config: dict[str, Any]) -> list[bool]:
    from mlx_lm.models.nemotron_h import ModelArgs

    # A hub card carries only the pattern (`ModelCard.config`), which is not enough for the
    # args; a whole config.json may spell it as block names, which its args turn into M E * -.
    pattern = config.get("hybrid_override_pattern")
    if pattern is None:
        pattern = ModelArgs.from_dict(config).hybrid_override_pattern or []
    if not isinstance(pattern, str | list):
        raise TypeError(f"hybrid_override_pattern is a {type(pattern).__name__}")
    return [kind in ("M", "*") for kind in pattern]  # mamba and attention blocks


def _nemotron_nas_cache_layers(config: dict[str, Any]) -> list[bool]:
    # A block whose attention is a no-op has no attention module, so no cache.
    return [
        not (block.get("attention") or {}).get("no_op", False) for block in config["block_configs"]
    ]


CACHE_LAYERS: dict[str, Callable[[dict[str, Any]], list[bool]]] = {
    "nemotron_h": _nemotron_h_cache_layers,
    "nemotron-nas": _nemotron_nas_cache_layers,
}


def cacheless_rank_refusal(
    model_type: str, config: dict[str, Any], ranges: list[tuple[int, int]]
) -> str | None:
    """Why a pipeline giving the ranks these layer `ranges` cannot run: a rank whose layers
    hold no cache. None when every rank holds one, or the config does not say."""
    which = CACHE_LAYERS.get(model_type)
    if which is None:
        return None
    try:
        holds = which(config)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a config this check cannot read: the runner's own check stays
    for rank, (start, end) in enumerate(ranges):
        if len(holds) >= end and not any(holds[start:end]):
            return (
                f"{model_type}: rank {rank} would hold layers [{start}, {end}), none of which "
                "holds a cache (in this model only some layers do), and a pipeline rank needs "
                "one; give that rank more layers or use fewer ranks"
            )
    return None


# -- Kimi K3: its own pipeline, cut for the placement's layer counts ---------------------------


def kimi_k3_pipeline(model: Any, group: mx.distributed.Group, counts: list[int]) -> None:
    """Kimi K3's text model pipelines itself: its forward receives the hidden state (and its
    attention-residual blocks, a state every later layer reads) from the next rank, sends
    them on and gathers the last hidden state on every rank. Its `pipeline()` only splits
    evenly; this is the same cut for the placement's `counts`, in mlx-lm's order (rank 0
    runs the last layers, as for `PipelineMixin`).

    The tiny config has attention residuals on (blocks of 2 layers), so the sweep's 1 + 3
    split passes a block on."""
    inner = model.language_model.model
    rank, size = group.rank(), group.size()
    if len(counts) != size or sum(counts) != len(inner.layers) or min(counts) < 1:
        raise ValueError(f"layer counts {counts} do not cover the model for the group")
    start = sum(counts[rank + 1 :])
    end = start + counts[rank]
    inner.pipeline_rank, inner.pipeline_size = rank, size
    inner.start_idx, inner.end_idx, inner.num_layers = start, end, end - start
    inner.layers = inner.layers[:end]
    inner.layers[:start] = [None] * start  # the layer numbers stay those of the weights
    if inner.use_attn_res:  # the residual blocks the ranks before this one started
        inner.in_blocks = -(-start // inner.args.attn_res_block_size)
    inner._set_cache_indices()


# Families whose mlx-lm model pipelines itself without mlx-lm's `PipelineMixin`.
OWN_PIPELINE: dict[str, Callable[[Any, mx.distributed.Group, list[int]], None]] = {
    "kimi_k3": kimi_k3_pipeline,
}
