"""Layer slicing for families whose layers read more than the hidden state the layer before
them wrote (`SlicedStage`'s `Slicing` entries in pipeline.py use these).

The rank before hands on one array per token. Where later layers also read something the
first rank computed from the tokens, the rank before packs it after the hidden state along
the last axis and the next rank unpacks it (`Slicing.handoff` gives the packed width):

* Talkie: every block adds the normalised token embedding (`e_x`);
* RWKV-7: every layer after the first mixes in the first layer's values (`v_first`);
* IQuest Loop Coder runs its stack twice: the state goes round the ranks twice;
* Gemma 3n and Gemma 4 (2B/4B): every layer reads its own per-layer input, computed from the
  token ids and the scaled embedding; Gemma 3n's hidden state is also a stack of AltUp
  predictions (packed side by side).

Gemma 3n and Gemma 4 also share keys and values: the last layers reuse the cache of the last
earlier layer of their kind. That cannot travel (it is the whole context), so a split must
keep such a layer on the rank of the layer whose cache it reads: placement refuses other
splits (`shared_kv_split_refusal`, from a local model's config.json), and so does the runner at
load (`check_shared_kv`), with the layers named.

Each forward here is the family's own forward (mlx-lm 0.32) on a slice of its layers: the
first rank computes what the family's forward computes before its first layer, the last rank
what it computes after its last one. `Span` says which part this rank is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache


@dataclass(frozen=True)
class Span:
    """This rank's layers [start, end) of `n_layers`; set on the inner model as `exo_span`."""

    start: int
    end: int
    n_layers: int

    @property
    def first(self) -> bool:
        return self.start == 0

    @property
    def last(self) -> bool:
        return self.end == self.n_layers


def span(inner: Any) -> Span:
    return inner.exo_span


class _Unused(nn.Module):
    """A part of the family's model that this rank never runs: its weights are not kept."""


def _drop(module: Any, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(module, name, None) is not None:
            setattr(module, name, _Unused())


def _unpack(x: mx.array, width: int) -> tuple[mx.array, mx.array]:
    """The hidden state (first `width` entries of the last axis) and what was packed after it."""
    return x[..., :width], x[..., width:]


def check_shared_kv(sources: list[int], where: Span, family: str) -> list[int]:
    """`sources`: for each layer of this rank (cut from the family's list), the layer whose
    keys and values it uses (itself, or an earlier one for a KV-shared layer). Returns them
    as positions in this rank's slice; refuses a split that puts them on another rank."""
    for i, source in enumerate(sources):
        if source < where.start:
            raise ValueError(
                f"{family}: layer {where.start + i} reuses the keys and values of layer "
                f"{source}, which this split puts on an earlier rank; the rank with layer "
                f"{where.start + i} must also hold layers {source} to {where.start + i}"
            )
    return [source - where.start for source in sources]


def kv_sources(layer_types: list[str], n_shared: int) -> list[int]:
    """For each layer, the layer whose keys and values it attends over: itself, or for the
    last `n_shared` layers the last earlier layer of its kind (Gemma 3n's and Gemma 4's rule)."""
    first_shared = len(layer_types) - n_shared
    if n_shared <= 0 or first_shared <= 0:
        return list(range(len(layer_types)))
    last_of = {kind: i for i, kind in enumerate(layer_types[:first_shared])}
    return [i if i < first_shared else last_of[k] for i, k in enumerate(layer_types)]


def shared_kv_split_refusal(
    module: str, config: dict[str, Any], ranges: list[tuple[int, int]]
) -> str | None:
    """Why a pipeline with these layer ranges per rank cannot run a Gemma 3n / Gemma 4 model
    (`config`: its config.json) because a KV-shared layer and its source sit on different
    ranks; None for any other family or a split that keeps them together."""
    text: dict[str, Any] = config.get("text_config") or config
    if module == "gemma3n":  # both entries are required in its text config
        kinds, n_shared = text.get("layer_types"), text.get("num_kv_shared_layers")
    elif module in ("gemma4", "gemma4_text"):
        from mlx_lm.models.gemma4_text import ModelArgs

        args = ModelArgs.from_dict(text)  # its defaults and its layer kinds from the pattern
        kinds, n_shared = args.layer_types, args.num_kv_shared_layers
    else:
        return None
    if not isinstance(kinds, list) or not isinstance(n_shared, int):
        return None  # not a config this can read: the runner still refuses a bad split
    sources = kv_sources([str(k) for k in kinds], n_shared)
    for rank, (start, end) in enumerate(ranges):
        for layer in range(start, min(end, len(sources))):
            if sources[layer] < start:
                return (
                    f"{module}: rank {rank} would hold layer {layer}, which reuses the keys and "
                    f"values of layer {sources[layer]} on an earlier rank; the rank with layer "
                    f"{layer} must also hold layers {sources[layer]} to {layer}"
                )
    return None


# IQuest Loop Coder: its forward runs the whole stack twice, the second loop attending over
# the first loop's keys and values of the same layer (held by the same rank). The hidden state
# goes round the ring twice: after the first loop the last rank hands it back to the first
# (`inner.exo_hop`, set by `SlicedStage`).


def loopcoder_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    from mlx_lm.models.iquestloopcoder import _mix_attention

    layers = inner.layers
    n = len(layers)
    caches: list[Any] = cache if cache is not None else [None] * (2 * n)
    h = inner.embed_tokens(inputs)
    batch, length = h.shape[:2]
    mask = create_attention_mask(h, caches[0])
    window_mask = create_attention_mask(h, caches[n], window_size=inner.loop_window_size)

    def out(attn: Any, x: mx.array) -> mx.array:
        return attn.o_proj(x.transpose(0, 2, 1, 3).reshape(batch, length, -1))

    first_kv: list[tuple[mx.array, mx.array]] = []
    for layer, c in zip(layers, caches[:n], strict=True):
        attn = layer.self_attn
        q, k, v = attn.get_qkv(layer.input_layernorm(h), c.offset if c is not None else 0)
        if c is not None:
            k, v = c.update_and_fetch(k, v)
        first_kv.append((k, v))
        h = h + out(attn, attn.attention(q, k, v, mask, cache=c))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = inner.exo_hop(h)  # round the ring: the first rank gets the last rank's state
    for layer, gate, c, (k1, v1) in zip(
        layers, inner.gate_projections, caches[n:], first_kv, strict=True
    ):
        attn = layer.self_attn
        q, k, v = attn.get_qkv(layer.input_layernorm(h), c.offset if c is not None else 0)
        global_part = attn.attention(q, k1, v1, mask, cache=c)
        if c is not None:
            k, v = c.update_and_fetch(k, v)
        local_part = attn.attention(q, k, v, window_mask, cache=c)
        h = h + out(attn, _mix_attention(gate(q), global_part, local_part))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return inner.norm(h)


# Talkie


def talkie_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    here = span(inner)
    if here.first:
        h = mx.fast.rms_norm(inner.embed(inputs), None, inner.eps)
        e_x = h
    else:
        h, e_x = _unpack(inner.embed(inputs), inner.args.hidden_size)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.blocks)
    mask = create_attention_mask(h, caches[0])
    for block, c in zip(inner.blocks, caches, strict=True):
        h = block(e_x, h, mask, c)
    if not here.last:
        return mx.concatenate([h, e_x], axis=-1)
    return mx.fast.rms_norm(h, None, inner.eps)


def talkie_head(text: Any, h: mx.array) -> mx.array:
    return text.lm_head_gain(h @ text.lm_head.T)  # a bare matrix and a learned gain


def twice_the_width(text: Any) -> int:
    return 2 * int(text.args.hidden_size)


# RWKV-7


def rwkv7_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    here = span(inner)
    x = inner.embeddings(inputs)
    v_first = None
    if not here.first:
        attn = inner.layers[0].attn
        x, v = _unpack(x, attn.hidden_size)
        v_first = v.reshape(*v.shape[:2], attn.num_heads, attn.head_dim)
    caches: list[Any] = cache if cache is not None else [None] * len(inner.layers)
    for layer, c in zip(inner.layers, caches, strict=True):
        x, v_first = layer(x, v_first, c)
    if not here.last:
        assert v_first is not None  # set by the first layer, on the first rank
        return mx.concatenate([x, v_first.reshape(*x.shape)], axis=-1)
    return inner.norm(x)


# LongCat Flash n-gram: the n-gram embedding keeps the last tokens in a cache of its own,
# before the layers' caches; only the first rank embeds, so only it has that cache.


def longcat_ngram_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    layers = inner.layers
    if span(inner).first:
        caches: list[Any] = cache if cache is not None else [None] * (len(layers) + 1)
        h = inner.ngram_embeddings(inputs, cache=caches[0])
        caches = caches[1:]
    else:
        caches = cache if cache is not None else [None] * len(layers)
        h = inner.ngram_embeddings(inputs)
    first = caches[0][0] if caches[0] is not None else None
    mask = create_attention_mask(h, first, return_array=True)
    for layer, c in zip(layers, caches, strict=True):
        h = layer(h, mask, cache=c)
    return inner.norm(h)


def longcat_ngram_caches(inner: Any) -> list[Any]:
    layers = [CacheList(KVCache(), KVCache()) for _ in inner.layers]
    if span(inner).first:
        from mlx_lm.models.cache import ArraysCache

        return [ArraysCache(size=1), *layers]
    return layers


# Gemma 4 (its 2B/4B models: per-layer inputs; the larger ones: none)


def _gemma4_per_layer_width(config: Any) -> int:
    return int(config.num_hidden_layers) * int(config.hidden_size_per_layer_input or 0)


def gemma4_handoff(text: Any) -> int:
    return int(text.args.hidden_size) + _gemma4_per_layer_width(text.args)


def gemma4_reindex(inner: Any) -> None:
    here = span(inner)
    inner.previous_kvs = check_shared_kv(list(inner.previous_kvs), here, "gemma4")
    if not here.first:  # the per-layer inputs come packed from the rank before
        _drop(inner, ("embed_tokens_per_layer", "per_layer_model_projection"))


def gemma4_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    here = span(inner)
    layers = inner.layers
    n, width = inner.num_hidden_layers, inner.hidden_size_per_layer_input
    per_layer: mx.array | None = None
    if here.first:
        embedded = inner.embed_tokens(inputs)
        h = embedded * inner.embed_scale
        if width:
            per_layer = inner._project_per_layer_inputs(
                h, inner._get_per_layer_inputs(inputs, embedded)
            )
    else:
        packed = inner.embed_tokens(inputs)
        h, rest = _unpack(packed, packed.shape[-1] - (n * width if width else 0))
        if width:
            per_layer = rest.reshape(*rest.shape[:2], n, width)
    caches: list[Any] = list(cache) if cache is not None else []
    caches += [None] * (len(layers) - len(caches))  # KV-shared layers hold no cache
    masks = inner._make_masks(h, caches)
    shared: list[tuple[Any, Any]] = [(None, None)] * len(layers)
    for i, (layer, c, mask, source) in enumerate(
        zip(layers, caches, masks, inner.previous_kvs, strict=True)
    ):
        kvs, offset = shared[source]
        own_input = per_layer[:, :, here.start + i, :] if per_layer is not None else None
        h, kvs, offset = layer(h, mask, c, per_layer_input=own_input, shared_kv=kvs, offset=offset)
        shared[i] = (kvs, offset)
    if here.last:
        return inner.norm(h)
    if per_layer is None:
        return h
    return mx.concatenate([h, per_layer.reshape(*h.shape[:2], -1).astype(h.dtype)], axis=-1)


def gemma4_caches(inner: Any) -> list[Any]:
    return [
        KVCache()
        if layer.layer_type == "full_attention"
        else RotatingKVCache(max_size=inner.window_size, keep=0)
        for layer in inner.layers
        if layer.self_attn.has_kv
    ]


def gemma4_head(text: Any, h: mx.array) -> mx.array:
    out = text.model.embed_tokens.as_linear(h) if text.tie_word_embeddings else text.lm_head(h)
    cap = text.final_logit_softcapping
    return mx.tanh(out / cap) * cap if cap is not None else out


# Gemma 3n: the hidden state is a stack of AltUp predictions (altup_num_inputs, B, L, H).


def gemma3n_handoff(text: Any) -> int:
    config = text.model.language_model.config
    return int(config.altup_num_inputs) * int(config.hidden_size) + int(
        config.num_hidden_layers
    ) * int(config.hidden_size_per_layer_input)


def gemma3n_reindex(inner: Any) -> None:
    here = span(inner)
    inner.layer_idx_to_cache_idx = check_shared_kv(
        list(inner.layer_idx_to_cache_idx), here, "gemma3n"
    )
    if not here.first:
        _drop(inner, ("embed_tokens_per_layer", "per_layer_model_projection"))
        inner.altup_projections = []
    if not here.last:
        inner.altup_unembed_projections = []


def gemma3n_caches(inner: Any) -> list[Any]:
    here, config = span(inner), inner.config
    return [
        KVCache()
        if config.layer_types[i] == "full_attention"
        else RotatingKVCache(max_size=config.sliding_window, keep=0)
        for i in range(here.start, min(here.end, inner.first_kv_shared_layer_idx))
    ]


def _gemma3n_first(inner: Any, inputs: mx.array) -> tuple[mx.array, mx.array]:
    """The first rank's start of Gemma 3n's forward: the AltUp stack and per-layer inputs."""
    h0 = inner.embed_tokens(inputs) * (inner.hidden_size**0.5)
    per_layer = inner.project_per_layer_inputs(h0, inner.get_per_layer_inputs(inputs))
    target = mx.mean(h0**2, axis=-1, keepdims=True) ** 0.5
    h = mx.stack([h0, *(proj(h0) for proj in inner.altup_projections)], axis=0)
    mags = mx.mean(h[1:] ** 2, axis=-1, keepdims=True) ** 0.5
    h[1:] = h[1:] * (target / mx.maximum(mags, mx.finfo(h0.dtype).min))
    return h, per_layer


def _gemma3n_last(inner: Any, h: mx.array) -> mx.array:
    """The last rank's end of Gemma 3n's forward: the AltUp stack back to one hidden state."""
    target = mx.mean(h[0] ** 2, axis=-1, keepdims=True) ** 0.5
    for i, proj in enumerate(inner.altup_unembed_projections):
        h[i + 1] = proj(h[i + 1])
    mags = mx.mean(h[1:] ** 2, axis=-1, keepdims=True) ** 0.5
    h[1:] = h[1:] * (target / mx.maximum(mags, mx.finfo(h.dtype).min))
    return inner.norm(mx.mean(h, axis=0))


def gemma3n_forward(inner: Any, inputs: mx.array, cache: list[Any] | None) -> mx.array:
    here, config = span(inner), inner.config
    stack, hidden = int(config.altup_num_inputs), int(config.hidden_size)
    if here.first:
        h, per_layer = _gemma3n_first(inner, inputs)
    else:
        packed, rest = _unpack(inner.embed_tokens(inputs), stack * hidden)
        batch, length = packed.shape[:2]
        h = packed.reshape(batch, length, stack, hidden).transpose(2, 0, 1, 3)
        per_layer = rest.reshape(batch, length, inner.num_hidden_layers, -1)
    caches: list[Any] = cache if cache is not None else []
    cache_of = inner.layer_idx_to_cache_idx
    kinds = [config.layer_types[i] for i in range(here.start, here.end)]

    def first_cache(kind: str) -> Any:
        i = kinds.index(kind) if kind in kinds else None
        return caches[cache_of[i]] if i is not None and caches else None

    full_mask = create_attention_mask(h[0], first_cache("full_attention"))
    window_mask = create_attention_mask(
        h[0], first_cache("sliding_attention"), window_size=inner.sliding_window
    )
    offset = caches[0].offset if caches else 0  # one offset for the pass, as in its forward
    for i, layer in enumerate(inner.layers):
        h = layer(
            h,
            full_mask if kinds[i] == "full_attention" else window_mask,
            caches[cache_of[i]] if caches else None,
            per_layer[:, :, here.start + i, :],
            offset=offset,
        )
    if here.last:
        return _gemma3n_last(inner, h)
    packed = h.transpose(1, 2, 0, 3).reshape(*h.shape[1:3], -1)
    return mx.concatenate([packed, per_layer.reshape(*h.shape[1:3], -1).astype(h.dtype)], -1)


def gemma3n_head(text: Any, h: mx.array) -> mx.array:
    inner = text.model.language_model
    out = inner.embed_tokens.as_linear(h)
    cap = inner.final_logit_softcapping
    return mx.tanh(out / cap) * cap if cap is not None else out
