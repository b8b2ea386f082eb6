"""What EXO_CPU_KERNELS=int8-batch buys against float activations, in this process (no server), with the
runner's fast BLAS preloaded.

Loads the model on the kernels (no fused or compiled step: the matmuls dominate either way) and,
alternating the two modes on the same layers round by round, times: a ~500-token prompt read
in the runner's 256-token chunks (those calls take dequantize + BLAS, float in both modes: the
mode should not matter), a 64-token prompt (one chunk on the kernels), and a decode step of 8
streams (8 rows) and of 1 stream (1 row: float in both). Prints medians of wall and process CPU
time (a shared machine: the CPU column shows the work) and float / int8-batch ratios.

    .venv/bin/python bench/bench_int8_speed.py [--models smollm2 1b] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).parent))
from bench_int8_accuracy import _model_dir

from exo_engine_mlx.activation_accuracy import CODE, PROSE
from exo_engine_mlx.cpu_kernels import INT8_BATCH_MIN_ROWS, simd, use_kernels

MODES = {"float": None, "int8-batch": INT8_BATCH_MIN_ROWS}
CHUNK = 256


def _prefill(model: Any, ids: list[int], rows: int = 1) -> list[Any]:
    cache = make_prompt_cache(model)
    for start in range(0, len(ids), CHUNK):
        mx.eval(model(mx.array([ids[start : start + CHUNK]] * rows), cache=cache))
    return cache


def _decode(model: Any, ids: list[int], rows: int, steps: int = 4) -> Callable[[], None]:
    """`steps` decode steps of `rows` streams, their prompt read ahead (not timed)."""
    cache = _prefill(model, ids, rows)
    token = mx.array([[ids[-1]]] * rows)

    def run() -> None:
        for _ in range(steps):
            mx.eval(model(token, cache=cache))

    return run


def _timed(make: Callable[[], Callable[[], object]]) -> tuple[float, float]:
    fn = make()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _bench(name: str, model: Any, ids: list[int], rounds: int) -> None:
    layers = [m for _, m in model.named_modules() if getattr(m, "int8_min_rows", 0) == 1]
    cases: dict[str, Callable[[], Callable[[], object]]] = {
        "prompt 500": lambda: lambda: _prefill(model, ids),
        "prompt 64": lambda: lambda: _prefill(model, ids[:64]),
        "decode 8 streams x4": lambda: _decode(model, ids[:32], 8),
        "decode 1 stream x4": lambda: _decode(model, ids[:32], 1),
    }
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for case, fn in cases.items():
            for mode, min_rows in MODES.items():
                for m in layers:
                    m.int8_min_rows = min_rows
                times.setdefault((case, mode), []).append(_timed(fn))
    print(f"\n{name}: {'':18} {'float':>15} {'int8-batch':>15}  float/int8 (CPU)")
    for case in cases:
        cells = []
        for mode in MODES:
            walls, cpus = zip(*times[(case, mode)], strict=True)
            cells.append((statistics.median(walls), statistics.median(cpus)))
        text = "".join(f" {w:7.3f} / {c:5.2f}" for w, c in cells)
        print(f"{name:8} {case:18}{text}  {cells[0][1] / cells[1][1]:5.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "1b"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from exo_core.plugin.engine import loaded_blas, runner_env

    # The runner's fast BLAS (LD_PRELOAD), so a prompt's long calls take BLAS as in a runner.
    if loaded_blas() is None and not os.environ.get("EXO_BENCH_REEXEC"):
        env = {**runner_env(), "EXO_BENCH_REEXEC": "1"}
        if "LD_PRELOAD" in env:
            os.execve(sys.executable, [sys.executable, *sys.argv], env)
    print(f"BLAS {loaded_blas()}")
    print(f"kernels {simd()}, load average {os.getloadavg()[0]:.1f}; wall / CPU s, medians")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            model, tokenizer = mlx_lm.load(str(_model_dir(name, Path(scratch))))[:2]
            use_kernels(model, int8=True)  # every layer, the head too: the ones a mode sets
            ids: list[int] = tokenizer.encode((PROSE + CODE) * 2)[:500]
            _bench(name, model, ids, args.rounds)


if __name__ == "__main__":
    main()
