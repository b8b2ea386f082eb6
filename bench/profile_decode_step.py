"""Where a decode step goes, in this process (no server): the embedded SmolLM2, or the
1B-shaped Q4_0 llama of bench/bench_model_1b.py (`--model 1b`, written and imported once).

    .venv/bin/python bench/profile_decode_step.py [--steps 30] [--model smollm2|1b] [--modes all|auto]

Loads the model as a runner does (kernels or dense, per EXO_CPU_KERNELS / EXO_DENSE; the
compiled one-token step per EXO_COMPILE_STEP; the runner's fast BLAS through `runner_env`), with
each of the step's foldings switched off in turn (EXO_FUSE_ROW_WORK, EXO_FUSED_ATTENTION,
EXO_COMPILE_STEP, EXO_CPU_KERNELS), then times:
  * the whole one-token step (model forward + eval) with a KV cache of a short prompt, in wall
    time and in CPU time of the whole process (all its threads: on a loaded machine the CPU
    time shows the work, the wall time also the waiting for a core);
  * the same step's matmuls alone: every linear layer and the output head, each timed on its
    own with the step's input shape (an eval each: on a quiet machine this mostly measures
    the per-eval hand-off to MLX's stream thread, see "one eval of a + a");
  * the primitives in one step's graph (what MLX dispatches per token, load-independent);
  * the step's kernel calls grouped by shape (q/k/v fused, o, gate/up fused, down, head), each
    group's calls in one eval (what one step spends on that shape), the weight bytes each reads
    and the rate in GB/s of wall and of CPU time (a loaded machine: the CPU column); the rest of the step (attention, embedding, sampling-free glue) is the
    whole step less the matmuls;
and prints the split. `--modes auto`: only the runner's default configuration (the 1B loads in
~10 s, its five modes take minutes). Medians over `--steps`; never asserts on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = "EXO_PROFILE_CHILD"


def _median_ms(fn, steps: int) -> float:  # type: ignore[no-untyped-def]
    return _median_wall_cpu_ms(fn, steps)[0]


def _median_wall_cpu_ms(fn, steps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    import mlx.core as mx

    mx.eval(fn())
    wall, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        mx.eval(fn())
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def _primitives(out: object) -> int:
    """Primitives in the graph that computes `out` (MLX's dot export: one box each)."""
    import mlx.core as mx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.dot"
        mx.export_to_dot(str(path), out)
        return path.read_text().count("shape=rectangle")


def _model_dir(name: str, tmp: Path) -> Path:
    if name == "1b":
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_model_1b import CACHE, ONE_B, ensure_imported

        from exo_core.plugin.cards import check_model_id
        from exo_engine_mlx.gguf.cli import default_out_dir

        ensure_imported(CACHE / "models", ONE_B)
        return default_out_dir(check_model_id(ONE_B.model_id), CACHE / "models")
    from exo_engine_mlx.embedded import ensure_embedded_model

    return ensure_embedded_model(tmp)


def _by_shape(model: object, steps: int, whole_ms: float, whole_cpu: float) -> None:
    """The step's kernel calls grouped by (out, in) shape, each group in one eval."""
    import mlx.core as mx

    from exo_engine_mlx.compiled_step import CompiledTransformerBlock
    from exo_engine_mlx.fused_linear import FusedLinear

    calls: dict[str, list[FusedLinear]] = {}
    for _, b in model.named_modules():  # type: ignore[attr-defined]
        if not isinstance(b, CompiledTransformerBlock):
            continue
        f = getattr(b, "_fused", None)
        if f is None:
            continue
        named = [("q/k/v", f.qkv), ("o", f.o_proj), ("gate/up", f.gate_up), ("down", f.down)]
        for label, call in named:
            if call is not None:
                n, k = int(call.weight.shape[0]), int(call.weight.shape[1]) * 32 // call.bits
                calls.setdefault(f"{label} {n}x{k}", []).append(call)
    embed = model.model.embed_tokens  # type: ignore[attr-defined]
    print(
        f"{'kernel calls by shape':26}{'calls':>6}{'ms':>9}{'share':>7}{'MB read':>9}{'GB/s':>7}",
        end="",
    )
    print(f"{'CPU ms':>9}{'GB/s CPU':>10}")
    total_ms = total_mb = total_cpu = 0.0
    groups = list(calls.items())
    for label, group in groups:
        k = int(group[0].weight.shape[1]) * 32 // group[0].bits
        x = mx.random.normal((1, 1, k))
        ms, cpu = _median_wall_cpu_ms(lambda g=group, x=x: [c(x) for c in g], steps)
        mb = sum(c.weight.nbytes + c.scales.nbytes + c.biases.nbytes for c in group) / 1e6
        total_ms, total_mb, total_cpu = total_ms + ms, total_mb + mb, total_cpu + cpu
        print(
            f"{label:26}{len(group):>6}{ms:>9.1f}{ms / whole_ms:>7.0%}{mb:>9.0f}{mb / ms:>7.1f}",
            end="",
        )
        print(f"{cpu:>9.1f}{mb / cpu:>10.1f}")
    if hasattr(embed, "as_linear"):
        hidden = int(embed["weight"].shape[1]) * 32 // int(embed.bits)
        x = mx.random.normal((1, 1, hidden))
        ms, cpu = _median_wall_cpu_ms(lambda: embed.as_linear(x), steps)
        mb = sum(embed[k].nbytes for k in ("weight", "scales", "biases")) / 1e6
        total_ms, total_mb, total_cpu = total_ms + ms, total_mb + mb, total_cpu + cpu
        label = f"head {int(embed['weight'].shape[0])}x{hidden}"
        print(f"{label:26}{1:>6}{ms:>9.1f}{ms / whole_ms:>7.0%}{mb:>9.0f}{mb / ms:>7.1f}", end="")
        print(f"{cpu:>9.1f}{mb / cpu:>10.1f}")
    print(
        f"{'all matmuls':26}{'':>6}{total_ms:>9.1f}{total_ms / whole_ms:>7.0%}{total_mb:>9.0f}",
        end="",
    )
    print(f"{total_mb / total_ms:>7.1f}{total_cpu:>9.1f}{total_mb / total_cpu:>10.1f}")
    rest, rest_cpu = whole_ms - total_ms, whole_cpu - total_cpu
    print(
        f"{'rest (attention, glue)':26}{'':>6}{rest:>9.1f}{rest / whole_ms:>7.0%}{'':>16}", end=""
    )
    print(f"{rest_cpu:>9.1f}")
    print(f"{'whole step reads':26}{'':>6}{whole_ms:>9.1f}{'':>7}{total_mb:>9.0f}", end="")
    print(f"{total_mb / whole_ms:>7.1f}{whole_cpu:>9.1f}{total_mb / whole_cpu:>10.1f}")


def profile(steps: int, model_name: str) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.cache import make_prompt_cache

    from exo_engine_mlx.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        model, _ = load_model(str(_model_dir(model_name, Path(tmp))))
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 41))]), cache=cache))
    token = mx.array([[42]])

    def step() -> mx.array:
        for c in cache:  # keep the cache at the prompt's length
            c.offset = 40
        return model(token, cache=cache)

    whole, whole_cpu = _median_wall_cpu_ms(step, steps)
    primitives = _primitives(step())
    hidden = int(model.args.hidden_size)
    tiny = mx.ones((hidden,))
    tiny_eval_ms = _median_ms(lambda: tiny + tiny, steps * 10)
    x = mx.random.normal((1, 1, hidden))
    layers = [m for _, m in model.named_modules() if isinstance(m, nn.Linear | nn.QuantizedLinear)]
    linear_ms = 0.0
    for m in layers:
        inp = mx.random.normal((1, 1, m.weight.shape[-1] * (32 // getattr(m, "bits", 32))))
        linear_ms += _median_ms(lambda m=m, inp=inp: m(inp), max(3, steps // 5))
    embed = model.model.embed_tokens
    head_ms = _median_ms(lambda: embed.as_linear(x), steps)
    kind = type(layers[0]).__name__
    import exo_mlx_cpu_kernels as kernels
    from exo_engine_mlx.compiled_step import (
        CompiledTransformerBlock,
        folds_row_work,
        fused_projections,
    )

    blocks = [m for _, m in model.named_modules() if isinstance(m, CompiledTransformerBlock)]
    fused = [f for b in blocks for f in fused_projections(b)]
    calls = len(layers) + 1 - sum(len(f.parts) - 1 for f in fused)
    print(f"layers: {len(layers)} x {kind}; kernel threads: {kernels.num_threads()}; ", end="")
    print(f"compiled blocks: {len(blocks)}; matmul calls a step: {calls} ", end="")
    print(f"({len(fused)} fused q/k/v or gate/up); ", end="")
    folded = sum(folds_row_work(b) for b in blocks)
    print(f"blocks folding norms/rope/SwiGLU/residuals: {folded}; primitives a step: {primitives}")
    print(f"{'whole one-token step':34}{whole:>9.1f} ms   (CPU time, all threads: ", end="")
    print(f"{whole_cpu:.1f} ms)")
    print(f"{'linear layers (sum, alone)':34}{linear_ms:>9.1f} ms  {linear_ms / whole:>5.0%}")
    print(f"{'output head (tied embedding)':34}{head_ms:>9.1f} ms  {head_ms / whole:>5.0%}")
    rest = whole - linear_ms - head_ms
    print(f"{'rest: attention, norms, per-op':34}{rest:>9.1f} ms  {rest / whole:>5.0%}")
    label = f"one eval of a + a ({hidden} floats)"
    print(f"{label:34}{tiny_eval_ms * 1e3:>9.1f} us")
    if blocks:
        _by_shape(model, steps, whole, whole_cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", choices=("smollm2", "1b"), default="smollm2")
    parser.add_argument(
        "--modes", default="all", help="all: each folding off in turn; else EXO_CPU_KERNELS values"
    )
    args = parser.parse_args()
    if os.environ.get(CHILD):
        profile(args.steps, args.model)
        return
    from exo_core.plugin.engine import runner_env

    print(f"load average {os.getloadavg()[0]:.1f}")
    # (kernels, compiled step, fold the row-wise work into the kernel calls, fused attention)
    modes = [("auto", "auto", "auto", "auto"), ("auto", "auto", "auto", "off")]
    modes += [("auto", "auto", "off", "auto"), ("auto", "off", "auto", "auto")]
    modes.append(("off", "auto", "auto", "auto"))
    if args.modes != "all":
        modes = [(kernel, "auto", "auto", "auto") for kernel in args.modes.split(",")]
    for kernels_mode, compile_mode, fold_mode, attention_mode in modes:
        env = {**runner_env(), CHILD: "1", "EXO_CPU_KERNELS": kernels_mode}
        env["EXO_COMPILE_STEP"] = compile_mode
        env["EXO_FUSE_ROW_WORK"] = fold_mode
        env["EXO_FUSED_ATTENTION"] = attention_mode
        print(f"\n== EXO_CPU_KERNELS={kernels_mode} EXO_COMPILE_STEP={compile_mode} ", end="")
        print(f"EXO_FUSE_ROW_WORK={fold_mode} EXO_FUSED_ATTENTION={attention_mode}", flush=True)
        child = [sys.executable, __file__, "--steps", str(args.steps), "--model", args.model]
        subprocess.run(child, env=env, check=True)


if __name__ == "__main__":
    main()
