"""Families mlx-lm's batch generator cannot batch (llama4, deepseek_v41), served one cache per
request (`generation_solo.SoloGenerator`): requests stepped in turn vs one after the other.

    uv run python bench/bench_unbatched.py [--model-type llama4] [--requests 4] [--tokens 32]

Both orders run the same requests through the engine's `BatchEngine` on a tiny random model of
the family (in turn: `max_concurrent` = the number of requests; one after the other:
`max_concurrent=1`, so a request waits until the one before it is done). Prints the total time,
the mean and worst time to first token, and their ratios; also a batchable family (llama) with
the batch generator vs the solo path, to show what batching would buy. Asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.loading import load_model
from exo_engine_mlx.tiny_model import make_tiny_model

PROMPTS = ["hello world", "the quick brown fox", "numbers like 12345", "def main():"]


def _run(
    loaded: tuple[Any, Any], n: int, tokens: int, concurrent: int, batched: bool
) -> dict[str, float]:
    engine = BatchEngine(*loaded, max_concurrent=concurrent, batched=batched)
    start = time.perf_counter()
    first: dict[str, float] = {}
    for i in range(n):
        params = GenerationParams(
            messages=(ChatMessage(role="user", content=PROMPTS[i % len(PROMPTS)]),),
            max_tokens=tokens,
            sampling=SamplingParams(temperature=0),
            ignore_eos=True,
        )
        engine.submit(TaskId(f"r{i}"), params)
    while engine.active:
        for chunk in engine.step():
            if isinstance(chunk, TextChunk) and chunk.task_id not in first:
                first[chunk.task_id] = time.perf_counter() - start
    total = time.perf_counter() - start
    ttfts = list(first.values()) or [total]
    return {"total": total, "ttft_mean": sum(ttfts) / len(ttfts), "ttft_max": max(ttfts)}


def _show(name: str, r: dict[str, float]) -> None:
    print(
        f"  {name:<22} total {r['total']:6.2f} s  ttft mean {r['ttft_mean']:6.3f} s  "
        f"max {r['ttft_max']:6.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-type", default="llama4")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-unbatched-"))
    n, tokens = args.requests, args.tokens

    loaded = load_model(
        str(make_tiny_model(root / args.model_type, model_type=args.model_type, layers=4))
    )
    _run(loaded, 1, 2, 1, False)  # warm up
    turns = _run(loaded, n, tokens, n, False)
    serial = _run(loaded, n, tokens, 1, False)
    print(f"{args.model_type}: {n} requests x {tokens} tokens, one cache per request")
    _show("in turn", turns)
    _show("one after the other", serial)
    print(
        f"  ratio (one after the other / in turn): total {serial['total'] / turns['total']:.2f}, "
        f"mean ttft {serial['ttft_mean'] / turns['ttft_mean']:.2f}, "
        f"worst ttft {serial['ttft_max'] / turns['ttft_max']:.2f}"
    )

    llama = load_model(str(make_tiny_model(root / "llama", model_type="llama", layers=4)))
    _run(llama, 1, 2, 1, True)
    batched = _run(llama, n, tokens, n, True)
    solo = _run(llama, n, tokens, n, False)
    print(f"llama (batchable): {n} requests x {tokens} tokens")
    _show("batch generator", batched)
    _show("solo path, in turn", solo)
    print(f"  ratio (solo / batched): total {solo['total'] / batched['total']:.2f}")


if __name__ == "__main__":
    main()
