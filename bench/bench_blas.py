"""GEMM GFLOP/s per BLAS, and SmolLM2 prefill/decode tok/s quantized vs dense, side by side.

    uv run python bench/bench_blas.py [--prompt-tokens 128] [--decode-tokens 32]

Every measurement runs in its own subprocess, because the BLAS is chosen at process start
(LD_PRELOAD). Prints numbers only; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from exo_core import blas as core_blas
from exo_engine_mlx import blas
from exo_engine_mlx.embedded import ensure_embedded_model

PROMPT_TEXT = (
    "The history of computing is a story of machines that got smaller, faster and cheaper. "
    "In 1945 a computer filled a room; by 2025 a phone held billions of transistors. "
)


def _child_gemm() -> dict[str, Any]:
    return {"gflops": blas.gemm_gflops(1024, seconds=1.5), "blas": core_blas.loaded_blas()}


def _child_model(model_dir: str, dense: bool, n_prompt: int, n_decode: int) -> dict[str, Any]:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = mlx_lm.load(model_dir)[:2]
    if dense:
        blas.dequantize_model(model)
    ids = tokenizer.encode(PROMPT_TEXT * 40, add_special_tokens=False)[:n_prompt]
    prompt = mx.array(ids)[None]

    def run(prompt: mx.array, n_new: int) -> tuple[float, float]:
        cache = make_prompt_cache(model)
        t0 = time.perf_counter()
        logits = model(prompt, cache=cache)
        tok = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(tok)
        t1 = time.perf_counter()
        for _ in range(n_new):
            tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
            mx.eval(tok)
        return t1 - t0, time.perf_counter() - t1

    run(prompt[:, :8], 2)  # warm-up: allocations and first-call setup
    prefill_s, decode_s = run(prompt, n_decode)
    return {
        "prefill_tps": prompt.shape[1] / prefill_s,
        "decode_tps": n_decode / decode_s,
        "blas": core_blas.loaded_blas(),
    }


def _spawn(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _thread_counts() -> list[int]:
    """The runner's default BLAS thread count, and all cores when that differs."""
    default, cores = core_blas.blas_threads({}), os.cpu_count() or 1
    return [default] if default == cores else [default, cores]


def _blas_variants() -> list[tuple[str, dict[str, str]]]:
    """(label, env overrides) per usable BLAS and thread count; the bundled reference first."""
    variants: list[tuple[str, dict[str, str]]] = [("reference BLAS (mlx-cpu)", {"EXO_BLAS": "off"})]
    for label, lib in core_blas.candidates():
        if not core_blas.preload_works(str(lib)):
            print(f"  (skipped {label}: cannot be preloaded here)")
            continue
        for n in _thread_counts():
            threads = {"OPENBLAS_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
            variants.append((f"{label}, {n} thr", {"EXO_BLAS": str(lib), **threads}))
    return variants


def _env(overrides: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    return core_blas.runner_env({**base, **overrides})


def _bench_gemm() -> None:
    print("fp32 GEMM 1024x1024, mx.matmul")
    base: float | None = None
    for label, overrides in _blas_variants():
        r = _spawn(["--child", "gemm"], _env(overrides))
        if "error" in r:
            print(f"  {label:<46} error: {r['error']}")
            continue
        base = base or r["gflops"]
        print(f"  {label:<46} {r['gflops']:8.1f} GFLOP/s  {r['gflops'] / base:6.1f}x")


def _bench_model(n_prompt: int, n_decode: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = ensure_embedded_model(Path(tmp))
        print(f"\nSmolLM2-135M Q4_1 (converted in {time.perf_counter() - t0:.2f} s)")
        print(f"prompt {n_prompt} tokens, decode {n_decode} tokens, greedy")
        print(f"  {'variant':<46} {'prefill tok/s':>14} {'decode tok/s':>13}")
        # The first fast BLAS found is what runners get; show it at each thread count.
        variants = _blas_variants()
        fast = variants[1 : 1 + len(_thread_counts())]
        results: list[tuple[str, dict[str, Any]]] = []
        for weights in ("quantized", "dense fp32"):
            for label, overrides in [variants[0], *fast]:
                child = ["--child", "model", "--model-dir", str(model_dir)]
                child += ["--prompt-tokens", str(n_prompt), "--decode-tokens", str(n_decode)]
                r = _spawn(
                    child + (["--dense"] if weights == "dense fp32" else []), _env(overrides)
                )
                name = f"{weights}, {label}"
                if "error" in r:
                    print(f"  {name:<46} error: {r['error']}")
                    continue
                results.append((name, r))
                print(f"  {name:<46} {r['prefill_tps']:14.1f} {r['decode_tps']:13.1f}")
    if results:
        ref_name, ref = results[0]
        print(f"\nratios against {ref_name} (prefill, decode)")
        for name, r in results:
            p = r["prefill_tps"] / ref["prefill_tps"]
            d = r["decode_tps"] / ref["decode_tps"]
            print(f"  {name:<46} {p:13.1f}x {d:12.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="GEMM and SmolLM2 speed with and without a fast BLAS"
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--child", choices=["gemm", "model"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--dense", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "gemm":
        print(json.dumps(_child_gemm()))
    elif args.child == "model":
        result = _child_model(args.model_dir, args.dense, args.prompt_tokens, args.decode_tokens)
        print(json.dumps(result))
    else:
        print(f"CPU cores: {os.cpu_count()}   (numbers vary with machine load)\n")
        _bench_gemm()
        _bench_model(args.prompt_tokens, args.decode_tokens)


if __name__ == "__main__":
    main()
