"""Where a decode step of the embedded SmolLM2 goes, in this process (no server).

    uv run python bench/profile_decode_step.py [--steps 30]

Loads the model as a runner does (kernels or dense, per EXO_CPU_KERNELS / EXO_DENSE; the
compiled one-token step per EXO_COMPILE_STEP; the runner's fast BLAS through `runner_env`), then
times:
  * the whole one-token step (model forward + eval) with a KV cache of a short prompt, in wall
    time and in CPU time of the whole process (all its threads: on a loaded machine the CPU
    time shows the work, the wall time also the waiting for a core);
  * the same step's matmuls alone: every linear layer and the output head, each timed on its
    own with the step's input shape;
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
    from exo_engine_mlx.compiled_step import CompiledTransformerBlock, fused_projections

    blocks = [m for _, m in model.named_modules() if isinstance(m, CompiledTransformerBlock)]
    fused = [f for b in blocks for f in fused_projections(b)]
    calls = len(layers) + 1 - sum(len(f.parts) - 1 for f in fused)
    print(f"layers: {len(layers)} x {kind}; kernel threads: {kernels.num_threads()}; ", end="")
    print(f"compiled blocks: {len(blocks)}; matmul calls a step: {calls} ", end="")
    print(f"({len(fused)} fused q/k/v or gate/up)")
    print(f"{'whole one-token step':34}{whole:>9.1f} ms   (CPU time, all threads: ", end="")
    print(f"{whole_cpu:.1f} ms)")
    print(f"{'linear layers (sum, alone)':34}{linear_ms:>9.1f} ms  {linear_ms / whole:>5.0%}")
    print(f"{'output head (tied embedding)':34}{head_ms:>9.1f} ms  {head_ms / whole:>5.0%}")
    rest = whole - linear_ms - head_ms
    print(f"{'rest: attention, norms, per-op':34}{rest:>9.1f} ms  {rest / whole:>5.0%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if os.environ.get(CHILD):
        profile(args.steps)
        return
    from exo_engine_mlx.blas import runner_env

    print(f"load average {os.getloadavg()[0]:.1f}")
    modes = [("auto", "auto"), ("auto", "off"), ("off", "auto")]
    for kernels_mode, compile_mode in modes:
        env = {**runner_env(), CHILD: "1", "EXO_CPU_KERNELS": kernels_mode}
        env["EXO_COMPILE_STEP"] = compile_mode
        print(f"\n== EXO_CPU_KERNELS={kernels_mode} EXO_COMPILE_STEP={compile_mode}", flush=True)
        subprocess.run([sys.executable, __file__, "--steps", str(args.steps)], env=env, check=True)


if __name__ == "__main__":
    main()
