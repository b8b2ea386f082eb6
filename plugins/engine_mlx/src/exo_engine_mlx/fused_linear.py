"""Kernel layers that read the same input (q/k/v, gate/up) as one kernel call (`fuse_linears`),
and a layer's row-wise work around its matmul in the same primitive (`FusedLinear.with_row_work`:
a decode step's RMSNorm, SwiGLU, residual and rotary), for the compiled decode step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

import exo_mlx_cpu_kernels as kernels
from exo_engine_mlx import cpu_kernels


@dataclass(frozen=True)
class FusedLinear:
    """Kernel layers that read the same input (q/k/v, gate/up) as one kernel call.

    Their packed weights, scales and biases are concatenated along the output rows; the kernel
    computes every output row from that row alone, so each part of the output is bit for bit
    what the layer alone gives, for one call's overhead instead of several. The layers keep
    their parameters as slices of the concatenation (views: no second copy), and take over
    where dequantize + BLAS would run (many rows), so a prefill is unchanged."""

    weight: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    bits: int
    int8_min_rows: int | None  # int8 activations for calls of at least this many rows
    ends: tuple[int, ...]  # where each layer's output rows end (the last is the total)
    parts: tuple[nn.Module, ...]
    implicit_bias: bool = False  # every part's biases are Q4_0's (`implied_q4_0_bias`)

    @property
    def read_biases(self) -> mx.array | None:
        return None if self.implicit_bias else self.biases

    def kernel_pays(self, rows: int) -> bool:
        """Whether the kernel, not dequantize + BLAS, is the cheaper way for `rows` rows of x
        (for every part: a part that would take the BLAS path takes it)."""
        cols = int(self.weight.shape[1]) * 32 // self.bits
        int8 = cpu_kernels.int8_for(self.int8_min_rows, rows)
        return not any(
            cpu_kernels.blas_pays(int8, rows, p["weight"].shape[0], cols, self.bits)
            for p in self.parts
        )

    def __call__(self, x: mx.array) -> list[mx.array]:
        rows = x.size // x.shape[-1] if x.ndim else 1
        if not self.kernel_pays(rows):
            return [p(x) for p in self.parts]
        y = kernels.quantized_matmul(
            x,
            self.weight,
            self.scales,
            self.read_biases,
            self.group_size,
            self.bits,
            cpu_kernels.int8_for(self.int8_min_rows, rows),
        )
        return list(mx.split(y, list(self.ends[:-1]), axis=-1))

    def with_row_work(
        self,
        x: mx.array,
        *,
        norm: nn.RMSNorm | None = None,
        swiglu: bool = False,
        residual: mx.array | None = None,
        split: bool = True,
        rope: tuple[nn.RoPE, int, mx.array] | None = None,
    ) -> list[mx.array]:
        """The parts' outputs with the row-wise work around them in the same primitive: an
        RMSNorm of x before (`norm`), or SwiGLU of x's [gate, up] halves (`swiglu`); a
        residual added after (one part, or `split=False`: the whole output as one array).
        `rope` = (the layer's nn.RoPE, head dim, offset array): rotate the first two parts (q,
        k) in the same primitive, each part shaped (B, heads, 1, head dim) for the attention
        (x must then be (B, 1, K)). Equal to the separate ops up to float32 rounding of the
        norm, the activation and the rotary's sin/cos."""
        rotary = None
        if rope is not None:
            r, head_dim, _ = rope
            rotary = (int(r.dims), head_dim, bool(r.traditional), float(r.base), float(r.scale))
        prologue = "rms_norm" if norm is not None else "swiglu" if swiglu else "none"
        return kernels.fused_linear(
            x,
            self.weight,
            self.scales,
            self.read_biases,
            self.group_size,
            self.bits,
            cpu_kernels.int8_for(self.int8_min_rows, x.size // x.shape[-1]),
            list(self.ends) if split else [self.ends[-1]],
            prologue=prologue,
            norm_weight=None if norm is None else norm["weight"],
            eps=0.0 if norm is None else float(norm.eps),
            residual=residual,
            rope=rotary,
            rope_offset=None if rope is None else rope[2],
            heads_out=rope is not None,
        )


def _kernel_setup(m: Any) -> tuple[int, int, int | None]:
    return *cpu_kernels.kernel_layout(m), m.int8_min_rows


def _plain(m: nn.Module) -> bool:
    return type(m) is cpu_kernels.KernelQuantizedLinear and "bias" not in m


def as_fused(m: nn.Module) -> FusedLinear | None:
    """A single plain kernel layer as a one-part FusedLinear (its own arrays, no copy), for
    `with_row_work`; None for anything else."""
    if not _plain(m):
        return None
    bits, group_size, int8 = _kernel_setup(m)
    rows = int(m["weight"].shape[0])
    return FusedLinear(
        m["weight"], m["scales"], m["biases"], group_size, bits, int8, (rows,), (m,),
        bool(getattr(m, "implicit_bias", False)),
    )  # fmt: skip


def fuse_linears(layers: Sequence[nn.Module]) -> FusedLinear | None:
    """One kernel call for `layers` (same input), or None where they cannot share one: not all
    plain kernel layers, a bias, or different bits / group sizes / activation modes."""
    if len(layers) < 2 or not all(_plain(m) for m in layers):
        return None
    setups = {_kernel_setup(m) for m in layers}
    if len(setups) != 1:
        return None
    bits, group_size, int8 = setups.pop()
    fused = {
        key: mx.concatenate([m[key] for m in layers], axis=0)
        for key in ("weight", "scales", "biases")
    }
    ends: list[int] = []
    for m in layers:
        start = ends[-1] if ends else 0
        ends.append(start + int(m["weight"].shape[0]))
        for key, whole in fused.items():
            m[key] = whole[start : ends[-1]]
    return FusedLinear(
        fused["weight"],
        fused["scales"],
        fused["biases"],
        group_size,
        bits,
        int8,
        tuple(ends),
        tuple(layers),
        all(getattr(m, "implicit_bias", False) for m in layers),
    )
