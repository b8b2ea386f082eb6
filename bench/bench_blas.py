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

from exo_engine_mlx import blas
from exo_engine_mlx.embedded import ensure_embedded_model

PROMPT_TEXT = (
    "The history of computing is a story of machines that got smaller, faster and cheaper. "
    "In 1945 a computer filled a room; by 2025 a phone held billions of transistors. "
)


def _child_gemm() -> dict[str, Any]:
    return {"gflops": blas.gemm_gflops(1024, seconds=1.5), "blas": blas.loaded_blas()}


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
        "blas": blas.loaded_blas(),
    }


def _spawn(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gemm_variants() -> list[tuple[str, str]]:
    """(label, EXO_BLAS value) for every usable BLAS here, the bundled reference first."""
    variants = [("reference BLAS (bundled with mlx-cpu)", "off")]
    for label, lib in blas.candidates():
        if blas.preload_works(str(lib)):
            variants.append((label, str(lib)))
        else:
            print(f"  (skipped {label}: cannot be preloaded here)")
    return variants


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
        return
    if args.child == "model":
        result = _child_model(args.model_dir, args.dense, args.prompt_tokens, args.decode_tokens)
        print(json.dumps(result))
        return

    print(f"CPU cores: {os.cpu_count()}   (numbers vary with machine load)\n")
    print("fp32 GEMM 1024x1024, mx.matmul")
    base: float | None = None
    for label, value in _gemm_variants():
        env = blas.runner_env({**os.environ, "EXO_BLAS": value})
        r = _spawn(["--child", "gemm"], env)
        if "error" in r:
            print(f"  {label:<44} error: {r['error']}")
            continue
        base = base or r["gflops"]
        print(f"  {label:<44} {r['gflops']:8.1f} GFLOP/s  {r['gflops'] / base:6.1f}x")

    fast = blas.find_fast_blas({**os.environ, "EXO_BLAS": "auto"})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        model_dir = ensure_embedded_model(Path(tmp))
        print(f"\nSmolLM2-135M Q4_1 (converted in {time.perf_counter() - t0:.2f} s)")
        print(f"prompt {args.prompt_tokens} tokens, decode {args.decode_tokens} tokens, greedy")
        print(f"  {'variant':<44} {'prefill tok/s':>14} {'decode tok/s':>13}")
        results: dict[tuple[str, str], dict[str, Any]] = {}
        blas_modes = [("reference BLAS", "off")] + ([("fast BLAS", str(fast))] if fast else [])
        for weights in ("quantized", "dense fp32"):
            for blas_label, value in blas_modes:
                env = blas.runner_env({**os.environ, "EXO_BLAS": value})
                extra = ["--dense"] if weights == "dense fp32" else []
                r = _spawn(
                    [
                        "--child",
                        "model",
                        "--model-dir",
                        str(model_dir),
                        "--prompt-tokens",
                        str(args.prompt_tokens),
                        "--decode-tokens",
                        str(args.decode_tokens),
                        *extra,
                    ],
                    env,
                )
                label = f"{weights}, {blas_label}"
                if "error" in r:
                    print(f"  {label:<44} error: {r['error']}")
                    continue
                results[(weights, blas_label)] = r
                print(f"  {label:<44} {r['prefill_tps']:14.1f} {r['decode_tps']:13.1f}")
    ref = results.get(("quantized", "reference BLAS"))
    if ref:
        print("\nratios against quantized + reference BLAS (prefill, decode)")
        for (weights, blas_label), r in results.items():
            p = r["prefill_tps"] / ref["prefill_tps"]
            d = r["decode_tps"] / ref["decode_tps"]
            print(f"  {weights + ', ' + blas_label:<44} {p:13.1f}x {d:12.1f}x")


if __name__ == "__main__":
    main()
