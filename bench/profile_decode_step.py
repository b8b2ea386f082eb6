"""Where a decode step of the embedded SmolLM2 goes, in this process (no server).

    uv run python bench/profile_decode_step.py [--steps 30]

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
and prints the split. Medians over `--steps`; never asserts on time.
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


def profile(steps: int) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.cache import make_prompt_cache

    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        model, _ = load_model(str(ensure_embedded_model(Path(tmp))))
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 41))]), cache=cache))
    token = mx.array([[42]])

    def step() -> mx.array:
        for c in cache:  # keep the cache at the prompt's length
            c.offset = 40
        return model(token, cache=cache)

    whole, whole_cpu = _median_wall_cpu_ms(step, steps)
    primitives = _primitives(step())
    tiny = mx.ones((576,))
    tiny_eval_ms = _median_ms(lambda: tiny + tiny, steps * 10)
    x = mx.random.normal((1, 1, 576))
    layers = [m for _, m in model.named_modules() if isinstance(m, nn.Linear | nn.QuantizedLinear)]
    linear_ms = 0.0
    for m in layers:
        inp = x if m.weight.shape[-1] * (32 // getattr(m, "bits", 32)) == 576 else None
        if inp is None:
            inp = mx.random.normal((1, 1, 1536))
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
    print(f"{'one eval of a + a (576 floats)':34}{tiny_eval_ms * 1e3:>9.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if os.environ.get(CHILD):
        profile(args.steps)
        return
    from exo_core.plugin.engine import runner_env

    print(f"load average {os.getloadavg()[0]:.1f}")
    # (kernels, compiled step, fold the row-wise work into the kernel calls, fused attention)
    modes = [("auto", "auto", "auto", "auto"), ("auto", "auto", "auto", "off")]
    modes += [("auto", "auto", "off", "auto"), ("auto", "off", "auto", "auto")]
    modes.append(("off", "auto", "auto", "auto"))
    for kernels_mode, compile_mode, fold_mode, attention_mode in modes:
        env = {**runner_env(), CHILD: "1", "EXO_CPU_KERNELS": kernels_mode}
        env["EXO_COMPILE_STEP"] = compile_mode
        env["EXO_FUSE_ROW_WORK"] = fold_mode
        env["EXO_FUSED_ATTENTION"] = attention_mode
        print(f"\n== EXO_CPU_KERNELS={kernels_mode} EXO_COMPILE_STEP={compile_mode} ", end="")
        print(f"EXO_FUSE_ROW_WORK={fold_mode} EXO_FUSED_ATTENTION={attention_mode}", flush=True)
        subprocess.run([sys.executable, __file__, "--steps", str(args.steps)], env=env, check=True)


if __name__ == "__main__":
    main()
