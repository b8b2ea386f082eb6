"""A one-row decode step's matmuls of the 1B-shaped Q4_0 model, scales in float32 vs float16.

    .venv/bin/python bench/profile_scales16.py [--repeats 15] [--threads 2] [--layers 16]

Llama-3.2-1B's shape (bench/bench_model_1b.py: hidden 2048, FFN 8192, 8 of 32 heads for k/v,
a 49152-row tied head), every matrix 4-bit, as the runner calls them (q/k/v and gate/up fused
into one kernel call each). Random codes, float16 scales and Q4_0's bias -8 * scale: the values
do not matter to the time, only the bytes. Each variant (group 32 or 64; scales and biases
float32 as before, or the float16 they came in) runs one step's matmuls in one eval; the
variants alternate round by round and each prints its median, quartiles, the weight bytes a
step reads and the bits a weight. Also checks that float16 and float32 scales give the same
bits. Never asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

import exo_mlx_cpu_kernels as kernels

HIDDEN, FFN, KV, VOCAB = 2048, 8192, 512, 49152


def _shapes() -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's kernel calls: qkv, o, gate+up, down."""
    return [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * FFN, HIDDEN), (HIDDEN, FFN)]


Layer = tuple[mx.array, mx.array, mx.array, int]  # codes, scales, biases, group size


def _layers(layers: int) -> list[tuple[mx.array, mx.array]]:
    """Codes and float16 group-32 scales of every matrix (the head last)."""
    out = []
    shapes = _shapes() * layers + [(VOCAB, HIDDEN)]
    for i, (n, k) in enumerate(shapes):
        key = mx.random.key(i)
        codes = mx.random.randint(0, 1 << 16, (n, k // 8, 2), key=key).astype(mx.uint32)
        words = codes[..., 0] | (codes[..., 1] << 16)
        scales = (mx.random.uniform(0.001, 0.02, (n, k // 32), key=key)).astype(mx.float16)
        mx.eval(words, scales)
        out.append((words, scales))
    return out


def _variant(base: list[tuple[mx.array, mx.array]], group: int, dtype: mx.Dtype) -> list[Layer]:
    made = []
    for words, scales in base:
        s = scales if group == 32 else scales.reshape(scales.shape[0], -1, 2)[..., 0]
        s = mx.contiguous(s.astype(dtype))  # a strided view would be copied every call
        b = (-8 * s.astype(mx.float32)).astype(dtype)  # exact: Q4_0's implicit bias
        mx.eval(s, b)
        made.append((words, s, b, group))
    return made


def _step(layers: list[Layer], xs: dict[int, mx.array]) -> list[mx.array]:
    return [
        kernels.quantized_matmul(xs[int(w.shape[1]) * 8], w, s, b, g, 4) for w, s, b, g in layers
    ]


def _bytes(layers: list[Layer]) -> int:
    return sum(w.nbytes + s.nbytes + b.nbytes for w, s, b, _ in layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=kernels.usable_cores())
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--avx2", action="store_true", help="the AVX2 kernels, not AVX-512")
    args = parser.parse_args()
    kernels.set_num_threads(args.threads)
    kernels.force_avx2(args.avx2)
    base = _layers(args.layers)
    weights = sum(int(w.shape[0]) * int(w.shape[1]) * 8 for w, _ in base)
    variants = {
        f"g{g} {name}": _variant(base, g, dtype)
        for g in (32, 64)
        for name, dtype in (("float32", mx.float32), ("float16", mx.float16))
    }
    xs = {k: mx.random.normal((1, k), key=mx.random.key(k)) for k in (HIDDEN, FFN)}
    for g in (32, 64):
        a = _step(variants[f"g{g} float32"], xs)
        b = _step(variants[f"g{g} float16"], xs)
        assert all(mx.array_equal(p, q).item() for p, q in zip(a, b, strict=True))
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for layers in variants.values():  # warm-up
        mx.eval(_step(layers, xs))
    for _ in range(args.repeats):
        for name, layers in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            mx.eval(_step(layers, xs))
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print(
        f"1B shape, {args.layers} layers + head, {weights / 1e9:.2f} G weights, one row, "
        f"{args.threads} threads, {args.repeats} rounds ({'avx2' if args.avx2 else kernels.simd()})"
    )
    print(
        f"{'variant':<14} {'MB a step':>10} {'bits/w':>7} {'wall ms':>8} {'q1-q3':>12} "
        f"{'CPU ms':>8} {'q1-q3':>12}"
    )
    for name, layers in variants.items():
        print(
            f"{name:<14} {_bytes(layers) / 1e6:>10.0f} {8 * _bytes(layers) / weights:>7.2f} "
            f"{_spread(times[name])} {_spread(cpu[name])}"
        )


def _spread(seconds: list[float]) -> str:
    """Median and quartiles in ms."""
    q1, median, q3 = statistics.quantiles([s * 1e3 for s in seconds], n=4)
    return f"{median:>8.1f} {q1:>5.1f}-{q3:<6.1f}"


if __name__ == "__main__":
    main()
