"""Micro-bench of exo's CPU quantized matmul kernels (plugins/mlx_cpu_kernels).

For SmolLM2-135M's shapes (576->1536, 1536->576, the 49152x576 tied head) and 1 / 8 / 40 rows
of activations (one stream, 8 streams, a 40-token prefill), prints milliseconds per call for:
  float   the kernel with float32 activations (exact up to summation order)
  int8    the kernel with activations quantized to int8 per 32 values (llama.cpp's way)
  deq+mm  kernels.dequantize + mx.matmul (a prefill's path; fast only with a fast BLAS)
  dense   mx.matmul on weights dequantized ahead (EXO_CPU_KERNELS=off: fp32 weights in memory)
and the GFLOP/s / weight GB/s of the best. Re-executes itself under the runner's environment
(LD_PRELOAD of the fast BLAS) so deq+mm sees what a runner sees. Prints numbers only.
`--baseline PATH` loads another build's extension (e.g. a copy of main's `_ext*.so`) into the
same process and times its float kernel beside this one's ("base ms"): old and new side by
side, under the same load.

    uv run --locked python bench/bench_cpu_kernels.py [--threads N] [--bits 4] [--group-size 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType

import mlx.core as mx

SHAPES = [("576->1536", 576, 1536), ("1536->576", 1536, 576), ("head 49152x576", 576, 49152)]
ROWS = [1, 8, 40]


def _load_baseline(path: str) -> ModuleType:
    """Another build of the extension as its own module (the name must end in `_ext`)."""
    spec = importlib.util.spec_from_file_location("exo_bench_baseline._ext", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _best_ms(fn: Callable[[], mx.array], clock: Callable[[], float], seconds: float = 0.6) -> float:
    mx.eval(fn())
    best, start = float("inf"), time.perf_counter()
    reps = 0
    while time.perf_counter() - start < seconds or reps < 3:
        t0 = clock()
        mx.eval(fn())
        best = min(best, clock() - t0)
        reps += 1
    return best * 1e3


def _time_methods(
    x: mx.array,
    layer: tuple[mx.array, mx.array, mx.array, int, int],
    clock: Callable[[], float],
    has_int8: bool,
    baseline: ModuleType | None = None,
) -> dict[str, float]:
    import exo_mlx_cpu_kernels as kernels

    wq, scales, biases, gs, bits = layer
    dense = kernels.dequantize(wq, scales, biases, gs, bits)
    mx.eval(dense)
    times = {
        "dense": _best_ms(lambda: x @ dense.T, clock),
        "float": _best_ms(lambda: kernels.quantized_matmul(x, wq, scales, biases, gs, bits), clock),
        "deq+mm": _best_ms(lambda: x @ kernels.dequantize(wq, scales, biases, gs, bits).T, clock),
    }
    if baseline is not None:
        times["base"] = _best_ms(
            lambda: baseline.quantized_matmul(x, wq, scales, biases, gs, bits), clock
        )
    if has_int8:
        times["int8"] = _best_ms(
            lambda: kernels.quantized_matmul(
                x, wq, scales, biases, gs, bits, int8_activations=True
            ),
            clock,
        )
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=0, help="kernel threads (0: usable cores)")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS, help="activation rows")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="CPU time of the process instead of wall time (with --threads 1 and "
        "OPENBLAS_NUM_THREADS=1: the cost of the work itself, not the load of a shared machine)",
    )
    parser.add_argument("--no-head", action="store_true", help="skip the 49152x576 head")
    parser.add_argument(
        "--baseline", help="another build's _ext*.so: its float kernel timed beside this one"
    )
    args = parser.parse_args()

    from exo_core.plugin.engine import loaded_blas, runner_env

    if loaded_blas() is None and "EXO_BENCH_REEXEC" not in os.environ:
        env = {**runner_env(), "EXO_BENCH_REEXEC": "1"}
        if "LD_PRELOAD" in env:
            os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import exo_mlx_cpu_kernels as kernels

    mx.set_default_device(mx.cpu)
    kernels.set_num_threads(args.threads or kernels.usable_cores())
    baseline = _load_baseline(args.baseline) if args.baseline else None
    if baseline is not None:
        baseline.set_num_threads(kernels.num_threads())
    clock = time.process_time if args.cpu_time else time.perf_counter
    has_int8 = "int8" in kernels.quantized_matmul.__doc__.lower()  # type: ignore[union-attr]
    print(
        f"simd {kernels.simd()}, kernel threads {kernels.num_threads()}, BLAS "
        f"{loaded_blas() or 'bundled reference'}, {args.bits}-bit g{args.group_size}, "
        f"{'CPU' if args.cpu_time else 'wall'} time"
    )
    print(
        f"{'shape':>16} {'rows':>4} {'float ms':>9} {'base ms':>8} {'int8 ms':>9} {'deq+mm ms':>10}"
        f" {'dense ms':>9}  best"
    )
    for label, k, n in SHAPES[:2] if args.no_head else SHAPES:
        w = mx.random.normal((n, k), key=mx.random.key(n))
        wq, scales, biases = mx.quantize(w, group_size=args.group_size, bits=args.bits)
        scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
        mx.eval(wq, scales, biases)
        gs, bits = args.group_size, args.bits
        for rows in args.rows:
            x = mx.random.normal((rows, k), key=mx.random.key(rows))
            mx.eval(x)
            times = _time_methods(x, (wq, scales, biases, gs, bits), clock, has_int8, baseline)
            base = f"{times.pop('base'):8.3f}" if "base" in times else f"{'-':>8}"
            best = min(times, key=lambda key: times[key])
            gflops = 2 * rows * k * n / times[best] / 1e6
            weight_gbs = (wq.nbytes + scales.nbytes + biases.nbytes) / times[best] / 1e6
            int8 = f"{times['int8']:9.3f}" if "int8" in times else f"{'-':>9}"
            print(
                f"{label:>16} {rows:>4} {times['float']:9.3f} {base} {int8} {times['deq+mm']:10.3f}"
                f" {times['dense']:9.3f}"
                f"  {best} ({gflops:.1f} GFLOP/s, weights {weight_gbs:.1f} GB/s)"
            )


if __name__ == "__main__":
    main()
