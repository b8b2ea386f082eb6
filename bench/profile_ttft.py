"""Where the time to first token of a short prompt goes, on the embedded SmolLM2.

    uv run python bench/profile_ttft.py [--runs 5]

Two measurements of the same ~40-token chat prompt (greedy, prefix cache off):
  * in a process set up as a runner (fast BLAS, the runner's loader, a warmed-up BatchEngine):
    the chat template, the tokenizer, the model's prefill forward alone, and the engine's
    submit -> first text chunk (prefill, first sample, detokenize);
  * through exo: a node with its OpenAI API and a runner subprocess: the official `openai`
    client streaming (request sent -> first content chunk), and one-token requests on exo's
    bench route, whose answer carries the runner's own submit -> first token time: the round
    trip less that time is exo's path outside the model (HTTP, request checks, scheduling on
    the node, the runner IPC both ways), measured on the same request so that the load of a
    shared machine mostly cancels out.
Medians over `--runs` (in the runner-like process also its CPU time, every thread's: on a
shared machine the steadier figure); never asserts on time.
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
from pathlib import Path
from typing import Any

PROMPT = (
    "Write a short story about a robot who learns to paint. The robot lives in a small town "
    "by the sea and has never seen a painting before."
)
MODEL_ID = "SmolLM2-135M-Instruct"
CHILD = "EXO_PROFILE_TTFT_CHILD"


def _median_s(fn, runs: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall, CPU time of this process: every thread's), medians over `runs` after a warm-up."""
    fn()
    walls, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def in_runner(runs: int) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.prompt import encode, render

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model(str(ensure_embedded_model(Path(tmp))))
    params = GenerationParams(
        messages=(ChatMessage(role="user", content=PROMPT),),
        max_tokens=2,
        sampling=SamplingParams(temperature=0),
        prefix_cache=False,
    )
    rendered = render(tokenizer, params)
    tokens = encode(tokenizer, params, rendered)
    engine = BatchEngine(model, tokenizer)

    def first_chunk() -> None:
        engine.submit(TaskId("t"), params)
        while not any(isinstance(c, TextChunk) for c in engine.step()):
            pass
        while engine.active:
            engine.step()

    def prefill() -> None:
        mx.eval(model(mx.array([tokens]), cache=make_prompt_cache(model)))

    return {
        "prompt_tokens": len(tokens),
        "template": _median_s(lambda: render(tokenizer, params), runs),
        "tokenizer": _median_s(lambda: encode(tokenizer, params, rendered), runs),
        "prefill": _median_s(prefill, runs),
        "engine": _median_s(first_chunk, runs),
    }


def through_exo(runs: int) -> tuple[float, float, float]:
    """(streaming request -> first content chunk, and for one-token requests on exo's bench
    route: client round trip, the runner's own submit -> first token), medians."""
    import httpx
    from openai import OpenAI

    import exo_api_openai.plugin as openai_plugin
    import exo_engine_mlx.plugin as engine_plugin
    from exo_core.testing.harness import running_node

    os.environ["EXO_PREFIX_CACHE_BYTES"] = "0"
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_node(Path(tmp), [engine_plugin, openai_plugin]) as running,
    ):
        client = OpenAI(base_url=f"{running.url}/v1", api_key="none", timeout=600, max_retries=0)
        # One client for every request: a new httpx client costs ~0.1 s (SSL context) itself.
        http = httpx.Client(base_url=running.url, timeout=600)

        def streamed() -> float:
            start = time.perf_counter()
            stream = client.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=2,
                temperature=0.0,
                stream=True,
            )
            first = None
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter()
            return (first or time.perf_counter()) - start

        def one_token() -> tuple[float, float]:
            body = {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 1,
                "temperature": 0.0,
            }
            start = time.perf_counter()
            r = http.post("/bench/chat/completions", json=body)
            elapsed = time.perf_counter() - start
            r.raise_for_status()
            return elapsed, float(r.json()["generation_stats"]["time_to_first_token_s"])

        streamed()  # places and loads the model
        first_chunk = statistics.median(streamed() for _ in range(runs))
        pairs = [one_token() for _ in range(runs)]
        return (
            first_chunk,
            statistics.median(p[0] for p in pairs),
            statistics.median(p[0] - p[1] for p in pairs),
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if os.environ.get(CHILD):
        print(json.dumps(in_runner(args.runs)))
        return
    from exo_core.plugin.engine import runner_env

    print(f"load average {os.getloadavg()[0]:.1f}; prompt {PROMPT!r}", flush=True)
    child = subprocess.run(
        [sys.executable, __file__, "--runs", str(args.runs)],
        env={**runner_env(), CHILD: "1"},
        check=True,
        capture_output=True,
        text=True,
    )
    inside = json.loads(child.stdout.strip().splitlines()[-1])
    first_chunk, round_trip, outside = through_exo(args.runs)
    print(f"prompt tokens {inside['prompt_tokens']}")
    rows: list[tuple[str, Any]] = [
        ("in a runner-like process:", None),
        ("  chat template", inside["template"]),
        ("  tokenizer", inside["tokenizer"]),
        ("  model prefill forward alone", inside["prefill"]),
        ("  engine: submit -> first chunk", inside["engine"]),
        ("through exo (a node + runner):", None),
        ("  streaming: request -> first chunk", first_chunk),
        ("  one token, bench route: round trip", round_trip),
        ("  of which outside the runner's step", outside),
    ]
    for label, seconds in rows:
        if seconds is None:
            print(label)
        elif isinstance(seconds, list):  # [wall, CPU time]
            print(f"{label:40}{seconds[0] * 1e3:>9.1f} ms  (CPU {seconds[1] * 1e3:.1f} ms)")
        else:
            print(f"{label:40}{seconds * 1e3:>9.1f} ms")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
