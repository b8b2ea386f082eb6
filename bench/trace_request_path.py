"""Where a cached prompt's first token waits between the HTTP request and the runner, on SmolLM2.

    .venv/bin/python bench/trace_request_path.py [--runs 12] [--llamacpp]

A node with its OpenAI API in this process (a thread) and its runner subprocess; one-token
requests on exo's bench route with the prefix cache on, the same short chat prompt each time
(so every request after the first is an exact prefix hit). The node's steps are timed as they
happen, by wrapping them in place: the SubmitTask command sent to the master and answered, the
worker's RunTask, the body fetch, the RunnerSubmit written to the runner's pipe, the first
chunk back from the runner. Beside them the runner's own submit -> first token
(`generation_stats`) and the client's round trip. Medians, in ms after the request was sent.
Then time to first token as a user sees it: the official `openai` client streaming the same
request from exo's /v1 (prefix cache on, as served) and, with `--llamacpp`, from llama-server
on the same GGUF with `cache_prompt` on (started as bench_vs_llamacpp.py starts it), side by
side with the ratio.
Prints numbers only; on a shared machine compare runs taken together.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPT = (
    "Write a short story about a robot who learns to paint. The robot lives in a small town "
    "by the sea and has never seen a painting before."
)
MODEL_ID = "SmolLM2-135M-Instruct"

_marks: dict[str, dict[str, float]] = defaultdict(dict)


def _mark(task_id: str, stage: str) -> None:
    _marks[task_id].setdefault(stage, time.perf_counter())


def _wrap_node() -> None:
    """Time the node's steps of a request (in place: this process's classes)."""
    from exo_core.chunks import ChunkRouter
    from exo_core.commands import SubmitTask
    from exo_core.peers import PeerProtocol as Peers
    from exo_core.subprocess_runner import SubprocessRunner
    from exo_core.worker import Worker

    send_command = Peers.send_command
    fetch_body = Peers.fetch_body

    async def timed_send(self: Peers, command: Any, timeout: float = 30.0) -> Any:
        if not isinstance(command, SubmitTask):
            return await send_command(self, command, timeout)
        _mark(command.task.task_id, "submit command sent")
        result = await send_command(self, command, timeout)
        _mark(command.task.task_id, "submit command answered")
        return result

    async def timed_fetch(self: Peers, task: Any) -> Any:
        result = await fetch_body(self, task)
        _mark(task.task_id, "body fetched (rank 0)")
        return result

    def wrapped(original: Callable[..., Any], stage: str, kind: str) -> Callable[..., Any]:
        def call(self: Any, message: Any) -> Any:
            if type(message).__name__ == kind:
                task_id = getattr(message, "task_id", None) or message.task.task_id
                _mark(task_id, stage)
            return original(self, message)

        return call

    Peers.send_command = timed_send  # type: ignore[method-assign]
    Peers.fetch_body = timed_fetch  # type: ignore[method-assign]
    Worker._act = wrapped(Worker._act, "worker runs the task", "RunTask")  # type: ignore[method-assign]
    SubprocessRunner._send = wrapped(  # type: ignore[method-assign]
        SubprocessRunner._send, "written to the runner's pipe", "RunnerSubmit"
    )
    deliver = ChunkRouter.deliver

    def timed_deliver(self: ChunkRouter, chunk: Any) -> bool:
        _mark(chunk.task_id, "first chunk back from the runner")
        return deliver(self, chunk)

    ChunkRouter.deliver = timed_deliver  # type: ignore[method-assign]


def streamed_first_token_s(base_url: str, model: str, runs: int, extra: dict[str, Any]) -> float:
    """Median time from sending a streaming request to its first content chunk (after one
    request that fills the prompt cache)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", timeout=600, max_retries=0)

    def once() -> float:
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=2,
            temperature=0.0,
            stream=True,
            extra_body=extra,
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
        return (first or time.perf_counter()) - start

    once()
    return statistics.median(once() for _ in range(runs))


def llamacpp_first_token_s(runs: int) -> float:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_vs_llamacpp import llama_server
    from llamacpp_build import build_server

    from exo_engine_mlx.embedded import embedded_gguf_path

    binary = build_server()
    if binary is None:
        raise SystemExit("llama-server could not be built")
    with (
        tempfile.TemporaryDirectory() as tmp,
        llama_server(binary, embedded_gguf_path(), 8, Path(tmp) / "llama.log") as (url, _),
    ):
        return streamed_first_token_s(url, "model", runs, {"cache_prompt": True})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--llamacpp", action="store_true", help="llama-server's beside")
    args = parser.parse_args()
    import httpx

    import exo_api_openai.plugin as openai_plugin
    import exo_engine_mlx.plugin as engine_plugin
    from exo_core.testing.harness import running_node

    _wrap_node()
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 1,
        "temperature": 0.0,
        "use_prefix_cache": True,
    }
    print(f"load average {os.getloadavg()[0]:.1f}; {args.runs} one-token requests", flush=True)
    rows: list[tuple[float, float, dict[str, float], dict[str, Any]]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_node(Path(tmp), [engine_plugin, openai_plugin]) as running,
        httpx.Client(base_url=running.url, timeout=600) as http,
    ):
        for i in range(args.runs + 2):  # the first places the model, the second fills the cache
            before = set(_marks)
            start = time.perf_counter()
            answer = http.post("/bench/chat/completions", json=body)
            end = time.perf_counter()
            answer.raise_for_status()
            (task_id,) = set(_marks) - before
            if i >= 2:
                rows.append((start, end, _marks[task_id], answer.json()["generation_stats"]))
        streamed = streamed_first_token_s(f"{running.url}/v1", MODEL_ID, args.runs, {})
    stages = sorted({k for *_, m, _ in rows for k in m}, key=lambda k: rows[0][2].get(k, 0.0))
    for stage in stages:
        after = statistics.median(m[stage] - s for s, _, m, _ in rows if stage in m)
        print(f"{stage:40}{after * 1e3:8.1f} ms")
    runner = statistics.median(stats["time_to_first_token_s"] for *_, stats in rows)
    print(f"{'runner: its own submit -> first token':40}{runner * 1e3:8.1f} ms")
    print(f"{'client round trip (one token, finished)':40}", end="")
    print(f"{statistics.median(e - s for s, e, _, _ in rows) * 1e3:8.1f} ms")
    print(f"prefix cache: {rows[-1][3].get('prefix_cache_hit')}, ", end="")
    print(f"{rows[-1][3].get('cached_tokens')} of {rows[-1][3].get('prompt_tokens')} tokens")
    print(f"{'exo: streamed first token (openai)':40}{streamed * 1e3:8.1f} ms")
    if args.llamacpp:
        theirs = llamacpp_first_token_s(args.runs)
        print(f"{'llama-server: streamed first token':40}{theirs * 1e3:8.1f} ms", end="")
        print(f"   exo / llama.cpp {streamed / theirs:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
