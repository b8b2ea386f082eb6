"""Time to first token of fresh long prompts on the embedded SmolLM2, prompt attention on exo's
tiled kernel against MLX's fallback (EXO_PREFILL_ATTENTION=auto | off).

    .venv/bin/python bench/profile_long_prefill.py [--sizes 512,1024,2048] [--runs 3] [--forward]

In a process set up as a runner (the runner's loader and fast BLAS, a BatchEngine with its
prompt chunks, the prefix cache off): each prompt (bench_fairness.long_prompt, ~`size` tokens
with the chat template) is submitted and stepped to its first token, the two settings
alternating run by run. `--forward`: the model's forward alone over `size` prompt tokens in
chunks of EXO_PREFILL_CHUNK's default, one BLAS thread (no spinning prefill threads: the
steadiest CPU time on a shared machine). Prints medians of wall and CPU time (every thread's; the steadier
figure on a shared machine) and the CPU time a prompt token, so that a cost growing faster
than the prompt shows. Never asserts on time.
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
from typing import Any

CHILD = "EXO_PROFILE_LONG_PREFILL_CHILD"
SETTINGS = ("auto", "off")


def child(sizes: list[int], runs: int, forward: bool) -> None:
    from bench_fairness import long_prompt

    from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.prompt import encode, render

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model(str(ensure_embedded_model(Path(tmp))))
    if forward:
        _forward(model, tokenizer.encode(long_prompt(max(sizes) + 100)), sizes, runs)
        return
    engine = BatchEngine(model, tokenizer)

    def params(size: int) -> GenerationParams:
        return GenerationParams(
            messages=(ChatMessage(role="user", content=long_prompt(size)),),
            max_tokens=1,
            sampling=SamplingParams(temperature=0),
            prefix_cache=False,
        )

    def first_token(p: GenerationParams) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        engine.submit(TaskId("t"), p)
        while not any(isinstance(c, TextChunk) for c in engine.step()):
            pass
        out = time.perf_counter() - start, time.process_time() - cpu
        while engine.active:
            engine.step()
        return out

    first_token(params(64))  # warm-up
    print(f"{'prompt':>8} {'attention':>10} {'wall s':>8} {'CPU s':>8} {'CPU ms/token':>13}")
    for size in sizes:
        p = params(size)
        tokens = len(encode(tokenizer, p, render(tokenizer, p)))
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in SETTINGS}
        for _ in range(runs):
            for setting in SETTINGS:
                os.environ["EXO_PREFILL_ATTENTION"] = setting
                times[setting].append(first_token(p))
        _print(tokens, times)


def _forward(model: Any, ids: list[int], sizes: list[int], runs: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from exo_engine_mlx.protocol import PREFILL_CHUNK

    def prefill(n: int) -> tuple[float, float]:
        cache = make_prompt_cache(model)
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(0, n, PREFILL_CHUNK):
            mx.eval(model(mx.array(ids[i : min(n, i + PREFILL_CHUNK)])[None], cache=cache))
        return time.perf_counter() - start, time.process_time() - cpu

    prefill(PREFILL_CHUNK)  # warm-up
    print(f"{'tokens':>8} {'attention':>10} {'wall s':>8} {'CPU s':>8} {'CPU ms/token':>13}")
    for size in sizes:
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in SETTINGS}
        for _ in range(runs):
            for setting in SETTINGS:
                os.environ["EXO_PREFILL_ATTENTION"] = setting
                times[setting].append(prefill(size))
        _print(size, times)


def _print(tokens: int, times: dict[str, list[tuple[float, float]]]) -> None:
    for setting in SETTINGS:
        wall = statistics.median(t[0] for t in times[setting])
        cpu = statistics.median(t[1] for t in times[setting])
        name = "kernel" if setting == "auto" else "mlx"
        print(f"{tokens:>8} {name:>10} {wall:>8.2f} {cpu:>8.2f} {1000 * cpu / tokens:>13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="512,1024,2048")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--forward", action="store_true", help="the model's forward alone")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if os.environ.get(CHILD):
        child(sizes, args.runs, args.forward)
        return
    from exo_core.plugin.engine import runner_env

    bench = str(Path(__file__).parent)
    env = {**runner_env(), CHILD: "1", "PYTHONPATH": bench}
    if args.forward:
        env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    subprocess.run([sys.executable, *sys.argv], env=env, check=True)


if __name__ == "__main__":
    main()
