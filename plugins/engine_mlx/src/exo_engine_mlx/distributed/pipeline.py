"""Pipeline parallel: each rank holds a contiguous run of layers and passes hidden states on.

Two ways, chosen by the model's class (`split_pipeline`):

* mlx-lm's own `pipeline()` (its `PipelineMixin`: DeepSeek V2/V3/V3.2, GLM 4 MoE, Qwen2,
  Qwen3 MoE, Qwen3-Next, Qwen3.5, Ministral 3, ...): the family's own forward pass, with its
  masks and caches (MoE, hybrid attention/SSM) as mlx-lm wrote them. mlx-lm gives rank 0 the
  *last* layers and every rank the final hidden state, so every rank computes the same logits.
* `PipelineStage` below, for llama-shaped models without the mixin.
* `SlicedStage` below, for the other families whose forward pass is a plain loop over their
  layers, one cache per layer (gpt-oss, MiniMax, Step 3.5): the family's own forward runs on
  this rank's slice of the layers, with the tokens' embedding replaced by the hidden state
  received from the rank before, and (before the last rank) the final norm left out.

In a `PipelineStage`, rank 0 embeds the tokens and runs the first layers; every later rank receives the hidden state
from the rank before it; the last rank applies the final norm and the head. The last rank's
logits (of the last position only) are then summed over the group with zeros from the other
ranks, so every rank's batch generator samples from the same logits and stays in step.

Only the weights a rank runs are kept: the others are dropped while still lazy, so they are
never read from disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache

# Model types whose inner model is embed_tokens -> layers(h, mask, cache) -> norm, with an
# lm_head or tied embeddings: the shape this stage re-implements.
PIPELINE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def _gpt_oss_indices(inner: Any) -> None:
    # The forward takes its full and sliding masks from the first cache of each kind.
    kinds = list(inner.layer_types)
    inner.ga_idx = kinds.index("full_attention") if "full_attention" in kinds else 0
    inner.swa_idx = kinds.index("sliding_attention") if "sliding_attention" in kinds else 0


def _step3p5_indices(inner: Any) -> None:
    sliding = [bool(layer.is_sliding) for layer in inner.layers]
    inner._swa_idx = sliding.index(True) if True in sliding else None
    inner._full_idx = sliding.index(False) if False in sliding else None
    inner.num_layers = len(inner.layers)


# Families `SlicedStage` splits: after slicing, how the inner model re-finds its mask indices
# (None: its masks come from its first cache, right for any slice). Each has a 2-rank test.
SLICED_MODEL_TYPES: dict[str, Callable[[Any], None] | None] = {
    "gpt_oss": _gpt_oss_indices,
    "minimax": None,
    "step3p5": _step3p5_indices,
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
    if _mixin_part(model) is not None:
        return "mlx-lm"
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = str(getattr(model, "model_type", ""))
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
    inner = _mixin_part(model)
    if inner is not None:
        if len(counts) != group.size() or sum(counts) != len(inner.layers):
            raise ValueError(f"layer counts {list(counts)} do not cover the model for the group")
        inner.pipeline(group, list(counts))
        return model
    if pipeline_method(model) == "sliced":
        return SlicedStage(model, start, end, group)
    return PipelineStage(model, start, end, group)


def _float_dtype(module: nn.Module) -> mx.Dtype:
    """The dtype of the module's first floating-point parameter (not packed quantized ints).

    The hidden state between layers has this dtype; reading it from a rank's own layers keeps
    every rank agreeing once each has converted its weights the same way (e.g. to float32)."""
    for _, value in tree_flatten(module.parameters()):
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
            # float32 for the exchange: exact for any model dtype, so greedy picks stay equal.
            logits = logits.astype(mx.float32)
        else:
            sent = mx.distributed.send(h, self._rank + 1, group=self._group)
            # A prefill step evaluates only the caches: make them carry the send.
            if cache is not None and cache[-1] is not None and cache[-1].keys is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, sent)
            logits = mx.depends(mx.zeros((batch, 1, self._vocab_size), dtype=mx.float32), sent)
        # Every rank gets the last rank's logits (the others add zeros), inside the graph.
        return mx.distributed.all_sum(logits, group=self._group)


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
        return self.head.as_linear(x)


class _Dropped(nn.Module):
    """A part this rank never runs (the head before the last rank): no weights kept."""

    def __call__(self, x: mx.array) -> mx.array:
        return x


class SlicedStage(nn.Module):
    """One rank's part of a family in `SLICED_MODEL_TYPES`: the family's own model, cut to
    layers [start, end), callable like the whole model."""

    def __init__(self, model: nn.Module, start: int, end: int, group: mx.distributed.Group) -> None:
        super().__init__()
        from mlx_lm.utils import MODEL_REMAPPING

        full: Any = model  # a model class of mlx-lm: typed by duck, checked by the caller
        model_type = str(full.model_type)
        inner = full.model
        n_layers = len(inner.layers)
        if not 0 <= start < end <= n_layers:
            raise ValueError(f"layers [{start}, {end}) are not within the model's {n_layers}")
        self._rank, self._size, self._group = group.rank(), group.size(), group
        self.first, self.last = self._rank == 0, self._rank == group.size() - 1
        self._hidden_size = int(full.args.hidden_size)
        self._vocab_size = int(full.args.vocab_size)
        # Every per-layer list of the inner model (layer kinds) is cut like the layers.
        # (An mlx module keeps list attributes as its dict's items.)
        for name, value in list(inner.items()):
            if isinstance(value, list) and len(value) == n_layers and name != "layers":
                inner[name] = value[start:end]
        inner.layers = inner.layers[start:end]
        reindex = SLICED_MODEL_TYPES[MODEL_REMAPPING.get(model_type, model_type)]
        if reindex is not None:
            reindex(inner)
        tied = not hasattr(full, "lm_head")
        if not self.first:
            head = inner.embed_tokens if self.last and tied else None
            inner.embed_tokens = _Received(self.receive, head)
        if not self.last:
            inner.norm = _Dropped()
            if not tied:
                full.lm_head = _Dropped()
        self.model = full
        self._tied = tied
        if len(self.make_cache()) != len(self.layers):  # the send rides on the last cache
            raise PipelineUnsupported(f"{model_type}: its caches do not follow its layers")

    @property
    def group(self) -> mx.distributed.Group:
        return self._group

    @property
    def layers(self) -> list[Any]:
        return self.model.model.layers

    def make_cache(self) -> list[Any]:
        own = getattr(self.model, "make_cache", None)
        return own() if own is not None else [KVCache() for _ in self.layers]

    def receive(self, inputs: mx.array) -> mx.array:
        shape = (inputs.shape[0], inputs.shape[1], self._hidden_size)
        template = mx.zeros(shape, dtype=_float_dtype(self.layers[0]))
        return mx.distributed.recv_like(template, self._rank - 1, group=self._group)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        inner = self.model.model
        h = inner(inputs, cache=cache)
        if self.last:
            # The head as these families' own forward applies it, on the last position only.
            out = h[:, -1:, :]
            logits = inner.embed_tokens.as_linear(out) if self._tied else self.model.lm_head(out)
            # float32 for the exchange: exact for any model dtype, so greedy picks stay equal.
            logits = logits.astype(mx.float32)
        else:
            h = h.astype(_float_dtype(self.layers[0]))
            sent = mx.distributed.send(h, self._rank + 1, group=self._group)
            # A prefill step evaluates only the caches: make them carry the send.
            if cache is not None and cache[-1] is not None and cache[-1].keys is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, sent)
            batch = inputs.shape[0]
            logits = mx.depends(mx.zeros((batch, 1, self._vocab_size), dtype=mx.float32), sent)
        # Every rank gets the last rank's logits (the others add zeros), inside the graph.
        return mx.distributed.all_sum(logits, group=self._group)
