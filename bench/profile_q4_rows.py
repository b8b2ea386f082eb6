"""One row (a decode step) through each 4-bit group-32 matrix shape of the 1B model, streamed
from memory: float16 scales with stored biases (5.0 bits a weight) or Q4_0's left out (biases
None: 4.5 bits), float and int8 activations, alternating per round; medians of the per-call CPU
time (process, all threads) and wall time, and the GB/s each reads.

    .venv/bin/python bench/profile_q4_rows.py [--threads 1] [--rounds 5]

Enough copies of each matrix that they exceed L3 (~96 MB): every call reads from memory, as a
decode step does. Never asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

import exo_mlx_cpu_kernels as kernels

SHAPES = [(2048, 2048), (3072, 2048), (16384, 2048), (2048, 8192), (49152, 2048)]
Matrix = tuple[mx.array, mx.array, mx.array]  # codes, float16 scales, stored biases


def _matrices(n: int, k: int) -> list[Matrix]:
    copies = max(1, int(96 / (n * k * 5 / 8 / 1e6)))
    out = []
    for i in range(copies):
        key = mx.random.key(i)
        codes = mx.random.randint(0, 1 << 16, (n, k // 8, 2), key=key).astype(mx.uint32)
        words = codes[..., 0] | (codes[..., 1] << 16)
        scales = mx.random.uniform(0.001, 0.02, (n, k // 32), key=key).astype(mx.float16)
        biases = (-8 * scales.astype(mx.float32)).astype(mx.float16)  # Q4_0's, exact
        mx.eval(words, scales, biases)
        out.append((words, scales, biases))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kernels.set_num_threads(args.threads)
    print(f"threads {args.threads}, simd {kernels.simd()}, vnni {kernels.vnni()}")
    for n, k in SHAPES:
        mats = _matrices(n, k)
        x = mx.random.normal((1, k))
        mx.eval(x)
        times: dict[tuple[bool, bool], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for int8 in (False, True):
                for implied in (False, True):
                    c0, w0 = time.process_time(), time.perf_counter()
                    outs = [
                        kernels.quantized_matmul(x, w, s, None if implied else b, 32, 4, int8)
                        for w, s, b in mats
                    ]
                    mx.eval(*outs)
                    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                    times.setdefault((int8, implied), []).append(
                        (cpu / len(mats), wall / len(mats))
                    )
        for (int8, implied), runs in times.items():
            cpu = statistics.median(c for c, _ in runs)
            wall = statistics.median(w for _, w in runs)
            read = n * k // 2 + (1 if implied else 2) * 2 * n * k // 32
            print(
                f"{n:5d}x{k:<5d} {'int8 ' if int8 else 'float'} {'4.5' if implied else '5.0'} bits"
                f"  CPU {cpu * 1e6:6.0f} us ({read / cpu / 1e9:5.1f} GB/s)"
                f"  wall {wall * 1e6:6.0f} us ({read / wall / 1e9:5.1f} GB/s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
