"""Where a runner's resident memory goes, and what each choice costs (the embedded SmolLM2, or
any imported model directory).

    .venv/bin/python bench/profile_runner_memory.py [--runs 2] [--decode 64]
        [--prompts 500 2000] [--model DIR] [--llamacpp [GGUF]]

In a process set up as a runner (the runner's environment and loader, a BatchEngine, prefix
cache off), prints after each stage the process's resident memory (/proc/self/smaps_rollup:
anonymous and file-backed) and MLX's own counters (active, cached, peak: tracemalloc does not
see MLX's buffers): after load, after a ~500-token prompt, after a ~2k-token prompt, after
decoding (`--prompts`: the prompts' sizes in tokens). Then the speed of the same stages (time to first token of each prompt, decode tok/s,
medians of `--runs`; the 2k prompt once; CPU
time of every thread beside the wall time: the steadier figure on a shared machine). Run it with the engine's settings in the environment to compare them,
e.g. EXO_KEEP_DENSE_BYTES=0 (no float32 copies of the weights). `--llamacpp`: llama-server on
the same GGUF (the embedded one, or the path given; started as bench_vs_llamacpp.py starts it:
8 slots of 4096 tokens) gets the same prompts, and its resident size is printed beside.
Never asserts on time. Timings on a shared machine are noisy: compare runs taken together.
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

CHILD = "EXO_PROFILE_RUNNER_MEMORY_CHILD"
# Plain English, varied enough that the tokenizer does not fold it: ~11 tokens a sentence.
SENTENCES = [
    "The lighthouse keeper counted the ships that passed the harbour every evening.",
    "A small robot learned to paint the colours of the sea from memory.",
    "Markets in the old town opened before dawn and closed after the rain.",
    "Her grandfather kept a notebook of every storm since nineteen fifty.",
    "The train to the mountains stopped twice for sheep on the line.",
]


def prompt_of(tokens: int) -> str:
    words = tokens * 10 // 13  # ~1.3 tokens a word in these sentences
    text: list[str] = []
    i = 0
    while sum(len(s.split()) for s in text) < words:
        text.append(f"{i}. {SENTENCES[i % len(SENTENCES)]}")
        i += 1
    return " ".join(text) + "\nSummarise the notes above in one sentence."


def memory_mb() -> dict[str, float]:
    import mlx.core as mx

    rollup: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            rollup[key] = int(parts[0]) / 1024
    return {
        "rss": rollup.get("Rss", 0.0),
        "anon": rollup.get("Anonymous", 0.0),
        "file": rollup.get("Rss", 0.0) - rollup.get("Anonymous", 0.0),
        "mlx_active": mx.get_active_memory() / 2**20,
        "mlx_cache": mx.get_cache_memory() / 2**20,
        "mlx_peak": mx.get_peak_memory() / 2**20,
    }


def in_runner(runs: int, decode: int, sizes: list[int], model_dir: str | None) -> dict[str, Any]:
    from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.idle_memory import give_back_freed_memory
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.prompt import encode, render

    stages: dict[str, dict[str, float]] = {"start": memory_mb()}
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model(model_dir or str(ensure_embedded_model(Path(tmp))))
    stages["loaded"] = memory_mb()
    engine = BatchEngine(model, tokenizer)
    n = 0
    trims: list[float] = []

    def params(prompt: str, max_tokens: int) -> GenerationParams:
        return GenerationParams(
            messages=(ChatMessage(role="user", content=prompt),),
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=0),
            prefix_cache=False,
            ignore_eos=True,
        )

    def run(p: GenerationParams) -> tuple[float, float, float, str]:
        """(time to first token, its CPU time (every thread's), decode tok/s after it, text)."""
        nonlocal n
        n += 1
        start, cpu = time.perf_counter(), time.process_time()
        first_cpu = 0.0
        engine.submit(TaskId(f"t{n}"), p)
        first, tokens, text = None, 0, []
        while engine.active:
            for c in engine.step():
                if isinstance(c, TextChunk):
                    if first is None:
                        first, first_cpu = time.perf_counter(), time.process_time() - cpu
                    tokens += 1
                    text.append(c.text)
        end = time.perf_counter()
        trim = time.perf_counter()
        give_back_freed_memory()  # as the runner does when it goes idle
        trims.append(time.perf_counter() - trim)
        assert first is not None
        return first - start, first_cpu, (tokens - 1) / max(end - first, 1e-9), "".join(text)

    speed: dict[str, float] = {}
    texts: dict[str, str] = {}
    for size in sizes:
        label = f"prompt_{size}"
        p = params(prompt_of(size), 1)
        speed[f"{label}_tokens"] = len(encode(tokenizer, p, render(tokenizer, p)))
        firsts = [run(p)[:2] for _ in range(runs if size < 1000 else 1)]  # 2k: once
        speed[f"{label}_ttft_s"] = statistics.median(f[0] for f in firsts)
        speed[f"{label}_cpu_s"] = statistics.median(f[1] for f in firsts)
        stages[f"after {label}"] = memory_mb()
    rates = []
    for _ in range(runs):
        _, _, rate, texts["decode"] = run(params("Write a story about a robot who paints.", decode))
        rates.append(rate)
    speed["decode_tok_s"] = statistics.median(rates)
    stages["after decode"] = memory_mb()
    speed["trim_max_s"] = max(trims)
    return {"stages": stages, "speed": speed, "text": texts["decode"][:200]}


def llama_server_rss_mb(gguf: Path, sizes: list[int], decode: int) -> float:
    """llama-server's resident MB after the same prompts and a decode (no prompt cache)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_fairness import rss_mb
    from bench_vs_llamacpp import llama_server
    from llamacpp_build import build_server
    from openai import OpenAI

    binary = build_server()
    if binary is None:
        raise SystemExit("llama-server could not be built")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llama_server(binary, gguf, 8, Path(tmp) / "llama-server.log") as (url, server),
    ):
        client = OpenAI(base_url=url, api_key="none", timeout=1800, max_retries=0)
        asks = [(prompt_of(size), 1) for size in sizes]
        for prompt, tokens in [*asks, ("Write a story about a robot who paints.", decode)]:
            client.chat.completions.create(
                model="model",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=tokens,
                temperature=0.0,
                extra_body={"cache_prompt": False},
            )
        return rss_mb(server.pid)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--decode", type=int, default=64, help="tokens decoded per run")
    parser.add_argument("--prompts", type=int, nargs="+", default=[500, 2000], help="tokens")
    parser.add_argument("--model", help="an imported MLX model directory (default: SmolLM2)")
    parser.add_argument("--llamacpp", nargs="?", const="", help="also llama-server on a GGUF")
    args = parser.parse_args()
    sizes = [str(n) for n in args.prompts]
    if os.environ.get(CHILD):
        print(json.dumps(in_runner(args.runs, args.decode, args.prompts, args.model)))
        return
    from exo_core.plugin.engine import runner_env

    settings = {k: v for k, v in os.environ.items() if k.startswith("EXO_")}
    print(f"load average {os.getloadavg()[0]:.1f}; settings {settings or 'defaults'}", flush=True)
    model = ["--model", args.model] if args.model else []
    command = [sys.executable, __file__, "--runs", str(args.runs), "--decode", str(args.decode)]
    child = subprocess.run(
        [*command, "--prompts", *sizes, *model],
        env={**runner_env(), CHILD: "1"},
        check=True,
        capture_output=True,
        text=True,
    )
    out = json.loads(child.stdout.strip().splitlines()[-1])
    columns = ["rss", "anon", "file", "mlx_active", "mlx_cache", "mlx_peak"]
    print(f"{'MB':22}" + "".join(f"{c:>11}" for c in columns))
    for stage, mem in out["stages"].items():
        print(f"{stage:22}" + "".join(f"{mem[c]:>11.0f}" for c in columns))
    speed = out["speed"]
    for label in (f"prompt_{n}" for n in sizes):
        tokens, ttft = speed[f"{label}_tokens"], speed[f"{label}_ttft_s"]
        cpu = speed[f"{label}_cpu_s"]
        print(f"{label}: {tokens} tokens, time to first token {ttft:.3f} s (CPU {cpu:.3f} s)")
    print(f"decode {speed['decode_tok_s']:.1f} tok/s; text {out['text']!r}")
    print(f"giving freed memory back when idle took at most {speed['trim_max_s'] * 1e3:.1f} ms")
    if args.llamacpp is not None:
        from exo_engine_mlx.embedded import embedded_gguf_path

        gguf = Path(args.llamacpp) if args.llamacpp else embedded_gguf_path()
        theirs = llama_server_rss_mb(gguf, args.prompts, args.decode)
        ours = out["stages"]["after decode"]["rss"]
        print(
            f"resident MB after the same requests: exo's runner {ours:.0f}, llama-server "
            f"{theirs:.0f} ({gguf.name}): {ours / theirs:.2f}x"
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
