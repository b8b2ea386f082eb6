"""Text generation on the embedded SmolLM2 through exo, beside mlx-lm on the same weights.

    uv run python bench/bench_generation.py [--tokens 64] [--dense auto|on|off]

Prints, in one run:
  * single-stream decode tok/s and time to first token through exo (a node, its worker and a
    runner subprocess), and the same prompt through mlx-lm's `stream_generate` in a process with
    the same environment (fast BLAS, dense weights), with their ratios;
  * aggregate decode tok/s through exo with 1, 4 and 8 concurrent streams.
Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import anyio

PROMPT = "Write a short story about a robot who learns to paint."
MODEL_ID = "SmolLM2-135M-Instruct"


def direct_mlx_lm(model_dir: Path, tokens: int) -> dict[str, float]:
    """mlx-lm's stream_generate in a fresh process with the runner's environment."""
    code = f"""
import json, time, psutil
from pathlib import Path
import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler
from exo_engine_mlx.loading import load_model
model, tok = load_model({str(model_dir)!r})
prompt = tok.apply_chat_template([{{"role": "user", "content": {PROMPT!r}}}], add_generation_prompt=True, tokenize=False)
for _ in stream_generate(model, tok, prompt, max_tokens=2): pass  # warm up, as exo's runner does
start = time.perf_counter(); first = None; n = 0
for r in stream_generate(model, tok, prompt, max_tokens={tokens}, sampler=make_sampler(0.0)):
    if first is None: first = time.perf_counter()
    n = r.generation_tokens
end = time.perf_counter()
print(json.dumps({{"ttft": first - start, "decode_tps": (n - 1) / (end - first), "tokens": n}}))
"""
    from exo_core.plugin.engine import runner_env

    out = subprocess.run(
        [sys.executable, "-c", code], env=runner_env(), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


async def one_stream(node, tokens: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    from exo_core.generation import (
        ChatMessage,
        FinishChunk,
        GenerationParams,
        SamplingParams,
        TextChunk,
    )

    params = GenerationParams(
        messages=(ChatMessage(role="user", content=PROMPT),),
        max_tokens=tokens,
        sampling=SamplingParams(temperature=0),
    )
    start = time.perf_counter()
    first = None
    generated = 0
    stream = await node.generation.generate(MODEL_ID, params)
    async with aclosing(stream) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, TextChunk) and first is None:
                first = time.perf_counter()
            if isinstance(chunk, FinishChunk):
                generated = chunk.usage.completion_tokens
    end = time.perf_counter()
    first = first or end
    return first - start, end - first, generated


async def concurrent(node, streams: int, tokens: int) -> float:  # type: ignore[no-untyped-def]
    results: list[tuple[float, float, int]] = []

    async def run() -> None:
        results.append(await one_stream(node, tokens))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(streams):
            tg.start_soon(run)
    elapsed = time.perf_counter() - start
    return sum(r[2] for r in results) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dense", default=os.environ.get("EXO_DENSE", "auto"))
    args = parser.parse_args()
    os.environ["EXO_DENSE"] = args.dense
    # Every run repeats the prompt: without this, exo's prefix cache would skip the prefill
    # that mlx-lm does each time, and the time-to-first-token ratio would flatter exo.
    os.environ["EXO_PREFIX_CACHE_BYTES"] = "0"

    import exo_engine_mlx.plugin as engine_plugin
    from exo_core.plugin.engine import find_fast_blas
    from exo_core.testing.harness import running_node
    from exo_engine_mlx.embedded import ensure_embedded_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = ensure_embedded_model(Path(tmp) / "models")
        print(f"model      {MODEL_ID} (dense={args.dense}, BLAS={find_fast_blas() or 'bundled'})")
        print(f"prompt     {PROMPT!r}, {args.tokens} new tokens, greedy, no prefix cache\n")
        with running_node(Path(tmp), [engine_plugin], api=False) as running:
            node = running.node
            running.call(one_stream, node, 4)  # places the instance and starts the runner
            runs = [running.call(one_stream, node, args.tokens) for _ in range(3)]
            exo_ttft = statistics.median(r[0] for r in runs)
            exo_tps = statistics.median((r[2] - 1) / r[1] for r in runs)
            aggregate = {n: running.call(concurrent, node, n, args.tokens) for n in (1, 4, 8)}
        direct = [direct_mlx_lm(model_dir, args.tokens) for _ in range(2)]
        mlx_ttft = statistics.median(d["ttft"] for d in direct)
        mlx_tps = statistics.median(d["decode_tps"] for d in direct)

    print(f"{'':22}{'exo':>10}{'mlx-lm':>10}{'exo/mlx-lm':>12}")
    print(f"{'decode tok/s':22}{exo_tps:>10.1f}{mlx_tps:>10.1f}{exo_tps / mlx_tps:>12.2f}")
    print(
        f"{'time to first token s':22}{exo_ttft:>10.3f}{mlx_ttft:>10.3f}{exo_ttft / mlx_ttft:>12.2f}"
    )
    print("\naggregate decode tok/s through exo")
    for n, tps in aggregate.items():
        print(f"  {n} stream(s) {tps:>10.1f}   ({tps / aggregate[1]:.2f}x one stream)")


if __name__ == "__main__":
    main()
