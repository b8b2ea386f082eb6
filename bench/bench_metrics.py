"""What `/metrics` costs: scrape time and size, and the request-counting middleware's share of a
cheap request.

    uv run python bench/bench_metrics.py [N]

A node with the scripted engine and the three dialects serves N chat completions (so the
counters and histograms hold series), then N scrapes of /metrics and N `GET /healthz` are timed.
Prints means and p95; never asserts on time.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

import exo_api_claude.plugin
import exo_api_ollama.plugin
import exo_api_openai.plugin
from exo_core.testing.harness import running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


def timed(n: int, call: Callable[[], object]) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def report(name: str, samples: list[float]) -> None:
    p95 = sorted(samples)[int(0.95 * (len(samples) - 1))]
    print(f"{name:<28} mean {1000 * statistics.mean(samples):7.2f} ms   p95 {1000 * p95:7.2f} ms")


def main(n: int) -> None:
    plugins = [
        ScriptedEnginePlugin(),
        exo_api_openai.plugin,
        exo_api_claude.plugin,
        exo_api_ollama.plugin,
    ]
    with tempfile.TemporaryDirectory() as tmp, running_node(Path(tmp), plugins) as node:
        http = httpx.Client(base_url=node.url, timeout=30)
        body = {"model": "scripted-echo", "messages": [{"role": "user", "content": "a b c"}]}
        chats = timed(n, lambda: http.post("/v1/chat/completions", json=body))
        scrapes = timed(n, lambda: http.get("/metrics"))
        health = timed(n, lambda: http.get("/healthz"))
        text = http.get("/metrics").text
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        print(f"{n} requests each (under load when the machine is shared)")
        report("chat completion", chats)
        report("GET /metrics", scrapes)
        report("GET /healthz (counted)", health)
        print(f"/metrics: {len(text)} bytes, {series} samples")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
