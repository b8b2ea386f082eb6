"""A compiled one-token step for llama-shaped layers on the CPU.

On the CPU a decode step of a small model is mostly many tiny MLX ops: per layer two RMS norms
and two rotary embeddings (each a chain of a dozen ops on the CPU, where `mx.fast` has no fused
kernel), reshapes, the residual adds and the MLP's activation. `mx.compile` fuses those chains
and replays the layer's graph without rebuilding it in Python. The KV cache grows every token,
so only the shape-stable parts are compiled: the part before the cache (norm, q/k/v projections,
rope with the offset passed as an array so that a new position is not a new graph) and the part
after attention (output projection, residual, norm, MLP, residual). The cache update runs as
before; the attention groups the query heads (attention.py) and, with exo's CPU kernels built,
is one kernel primitive a layer instead of ~8 MLX ops (EXO_FUSED_ATTENTION=off: the ops). On
exo's CPU kernels the projections that read the same input (q/k/v, gate/up) run as one kernel
call each (`fused_linear.fuse_linears`: bit for bit the same outputs, 4 kernel calls a layer
instead of 7). The step also folds the row-wise work into those calls
(`FusedLinear.with_row_work`): the RMSNorms into the q/k/v and gate/up calls, the rotary
embedding (plain nn.RoPE) into q/k/v's, which also hands q/k/v over already split by head,
SwiGLU into the down projection's, the residual adds into the output and down projections': a
SmolLM2 step is 352 primitives instead of 2302 (562 instead of 2512 with the attention as MLX
ops; equal up to float32 rounding of the norms, the activation and sin/cos;
EXO_FUSE_ROW_WORK=off keeps the separate ops). A batch's step (several streams, one row each,
each rotated by its own offset) folds the same way while the kernel is cheaper than dequantize
+ BLAS for its rows: at 8 streams ~18 % less CPU a step (bench/profile_batch_step.py).

Only a one-token step (decode) takes this path; a prefill (many tokens) runs the layer as
mlx-lm wrote it. Graphs are traced once per batch size (the runner's warm-up traces one row).
Tensor-sharded layers (their output projection sums over the group) and quantized KV caches are
left as they are. EXO_COMPILE_STEP=auto (default) | off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.activations import swiglu

import exo_mlx_cpu_kernels as kernels
from exo_engine_mlx.attention import decode_attention
from exo_engine_mlx.fused_linear import FusedLinear, as_fused, fuse_linears

_OFF = ("off", "0", "no", "false")


def compile_requested(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("EXO_COMPILE_STEP", "auto").strip().lower() not in _OFF


def row_work_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether a decode step folds norms, activation and residual adds into the kernel calls."""
    env = os.environ if env is None else env
    return env.get("EXO_FUSE_ROW_WORK", "auto").strip().lower() not in _OFF


@dataclass(frozen=True)
class _Graphs:
    """The layer's compiled halves (a plain object, so that nn.Module keeps it out of its
    parameter tree)."""

    before_cache: Callable[[mx.array, mx.array], tuple[mx.array, mx.array, mx.array]]
    after_attention: Callable[[mx.array, mx.array], mx.array]


@dataclass(frozen=True)
class _Fused:
    """The layer's projections fused at load (None: run them one by one)."""

    qkv: FusedLinear | None
    gate_up: FusedLinear | None
    o_proj: FusedLinear | None = None
    down: FusedLinear | None = None

    def row_work(self, layer: llama.TransformerBlock) -> bool:
        """Whether every projection is a kernel call and both norms are plain RMSNorms (then
        a decode step runs the block as 4 primitives around the attention)."""
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        calls = (self.qkv, self.gate_up, self.o_proj, self.down)
        return all(c is not None for c in calls) and all(type(n) is nn.RMSNorm for n in norms)

    def kernel_pays(self, rows: int) -> bool:
        """Whether every call takes the kernel (not dequantize + BLAS) for `rows` rows."""
        calls = (self.qkv, self.gate_up, self.o_proj, self.down)
        return all(c is not None and c.kernel_pays(rows) for c in calls)


def _fuse_layer(layer: llama.TransformerBlock) -> _Fused:
    attn, mlp = layer.self_attn, layer.mlp
    return _Fused(
        fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj]),
        fuse_linears([mlp.gate_proj, mlp.up_proj]),
        as_fused(attn.o_proj),
        as_fused(mlp.down_proj),
    )


def _compile_layer(layer: llama.TransformerBlock) -> _Graphs:
    attn, mlp = layer.self_attn, layer.mlp
    heads, kv_heads = int(attn.n_heads), int(attn.n_kv_heads or attn.n_heads)
    rope: Any = attn.rope  # mlx-lm's ropes take the offset as an int or an array
    fused: _Fused = getattr(layer, "_fused", None) or _Fused(None, None)
    row_work = fused.row_work(layer) and row_work_requested()

    def folds(x: mx.array) -> bool:
        # Norms fold exactly only on float32 rows (MLX rounds a bf16 norm before the weight).
        # Any number of one-token rows (a batch's rows each rotate by their own offset), while
        # the kernel is cheaper than dequantize + BLAS for that many.
        return row_work and x.dtype == mx.float32 and fused.kernel_pays(x.shape[0])

    # mx.fast.rope runs as ~15 ops per call on the CPU: a plain nn.RoPE folds into q/k/v.
    rotary = type(rope) is nn.RoPE
    head_dim = int(attn.q_proj["weight"].shape[0]) // heads

    def projections(h: mx.array) -> list[mx.array]:
        if fused.qkv is not None:
            return fused.qkv(h)
        return [attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)]

    def split_heads(q: mx.array, k: mx.array, v: mx.array) -> tuple[mx.array, ...]:
        q = mx.unflatten(q, -1, (heads, -1)).transpose(0, 2, 1, 3)
        k = mx.unflatten(k, -1, (kv_heads, -1)).transpose(0, 2, 1, 3)
        v = mx.unflatten(v, -1, (kv_heads, -1)).transpose(0, 2, 1, 3)
        return q, k, v

    def before_cache(x: mx.array, offset: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        if fused.qkv is not None and folds(x):
            norm = layer.input_layernorm
            if rotary:  # q, k, v come as (B, heads, 1, D)
                q, k, v = fused.qkv.with_row_work(x, norm=norm, rope=(rope, head_dim, offset))
                return q, k, v
            q, k, v = split_heads(*fused.qkv.with_row_work(x, norm=norm))
        else:
            q, k, v = split_heads(*projections(layer.input_layernorm(x)))
        return rope(q, offset=offset), rope(k, offset=offset), v

    def feed_forward(h: mx.array) -> mx.array:
        if fused.gate_up is None:
            return mlp(h)
        gate, up = fused.gate_up(h)
        return mlp.down_proj(swiglu(gate, up))

    def block_rest(x: mx.array, attended: mx.array) -> mx.array:
        # 3 primitives (o_proj + residual, norm + gate/up, SwiGLU + down + residual).
        assert fused.o_proj and fused.gate_up and fused.down  # folds() checked them
        (h,) = fused.o_proj.with_row_work(attended, residual=x)
        norm = layer.post_attention_layernorm
        (gate_up,) = fused.gate_up.with_row_work(h, norm=norm, split=False)
        return fused.down.with_row_work(gate_up, swiglu=True, residual=h)[0]

    def after_attention(x: mx.array, attended: mx.array) -> mx.array:
        if folds(x):  # (B, heads, 1, D) -> (B, 1, heads * D): the same order when L = 1
            return block_rest(x, attended.reshape(x.shape[0], 1, -1))
        attended = mx.flatten(attended.transpose(0, 2, 1, 3), -2, -1)
        h = x + attn.o_proj(attended)
        return h + feed_forward(layer.post_attention_layernorm(h))

    return _Graphs(mx.compile(before_cache), mx.compile(after_attention))


class CompiledTransformerBlock(llama.TransformerBlock):
    """mlx-lm's llama block whose one-token step runs as two compiled graphs."""

    def __call__(
        self, x: mx.array, mask: mx.array | None = None, cache: Any | None = None
    ) -> mx.array:
        if x.shape[1] != 1 or cache is None or hasattr(cache, "bits"):
            if _kernel_activation(x):
                return self._prompt_step(x, mask, cache)
            return super().__call__(x, mask, cache)
        graphs: _Graphs | None = getattr(self, "_graphs", None)
        if graphs is None:
            graphs = _compile_layer(self)
            object.__setattr__(self, "_graphs", graphs)
        offset = cache.offset
        q, k, v = graphs.before_cache(
            x, offset if isinstance(offset, mx.array) else mx.array(offset)
        )
        k, v = cache.update_and_fetch(k, v)
        scale = self.self_attn.scale
        # Grouped query heads (attention.py): one kernel primitive, or the rows of one product.
        attended = decode_attention(q, k, v, scale=scale, mask=mask)
        return graphs.after_attention(x, attended)

    def _prompt_step(self, x: mx.array, mask: mx.array | None, cache: Any | None) -> mx.array:
        """mlx-lm's block (llama.TransformerBlock.__call__) with the MLP's activation as the
        kernels' vectorised SwiGLU: MLX's CPU sigmoid runs a scalar exp, ~20 % of a SmolLM2
        prefill. The same value up to float32 rounding of exp."""
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        mlp = self.mlp
        normed = self.post_attention_layernorm(h)
        return h + mlp.down_proj(kernels.swiglu(mlp.gate_proj(normed), mlp.up_proj(normed)))


def _kernel_activation(x: mx.array) -> bool:
    """Whether a prompt's step runs SwiGLU on the kernels: float32 on the CPU, kernels built,
    row work not switched off (EXO_FUSE_ROW_WORK=off keeps MLX's ops, for A/B runs)."""
    return (
        x.dtype == mx.float32
        and kernels.available()
        and mx.default_device() == mx.cpu
        and row_work_requested()
    )


def _sums_over_a_group(layer: nn.Module) -> bool:
    distributed = (nn.ShardedToAllLinear, nn.QuantizedShardedToAllLinear)
    distributed += (nn.AllToShardedLinear, nn.QuantizedAllToShardedLinear)
    return any(isinstance(m, distributed) for _, m in layer.named_modules())


def _compilable(m: nn.Module) -> bool:
    # Exactly mlx-lm's llama classes: a subclass may change the computation.
    return (
        type(m) is llama.TransformerBlock
        and type(m.self_attn) is llama.Attention
        and type(m.mlp) is llama.MLP
        and not _sums_over_a_group(m)
    )


def fused_projections(block: nn.Module) -> list[FusedLinear]:
    """The kernel calls that stand for several of `block`'s projections in its one-token step."""
    fused: _Fused | None = getattr(block, "_fused", None)
    return [f for f in (fused.qkv, fused.gate_up) if f is not None] if fused else []


def folds_row_work(block: nn.Module) -> bool:
    """Whether `block`'s decode step runs as 4 kernel primitives (norms, rotary, activation
    and residual adds folded in) around the attention."""
    fused: _Fused | None = getattr(block, "_fused", None)
    return fused is not None and fused.row_work(block) and row_work_requested()  # type: ignore[arg-type]


def compile_decode_step(model: nn.Module) -> int:
    """Switch every llama block of `model` whose one-token step can be compiled, in place (only
    the class changes; parameters and names stay, kernel layers' parameters become views of
    their fused weights). Returns how many were switched."""
    switched = 0
    for _, m in model.named_modules():
        if _compilable(m):
            m.__class__ = CompiledTransformerBlock
            object.__setattr__(m, "_fused", _fuse_layer(m))
            switched += 1
    return switched
