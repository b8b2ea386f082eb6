"""How long a running stream pauses while a long prompt arrives, and what the servers hold.

    .venv/bin/python bench/bench_fairness.py [--prompt-tokens 2000] [--runs 2]

Against one `exo` node serving the embedded SmolLM2 (the prefix cache off): stream A is
generating when prompt B (~`--prompt-tokens` tokens, max_tokens 1) is sent; the longest gap
between two of A's content chunks from B's sending until B's answer is the pause (before
chunked prefill, a 2k prompt stopped every stream until it was read). Also prints the node's
and the runner's resident memory after the requests. `bench_vs_llamacpp.py` uses the same
functions for both servers. Never asserts on time; a shared machine moves these figures.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# About 14 SmolLM2 tokens a sentence; the words rotate so that no span repeats.
_WORDS = [
    "river",
    "stone",
    "lantern",
    "orbit",
    "copper",
    "meadow",
    "violet",
    "engine",
    "harbor",
    "cedar",
    "signal",
    "canyon",
    "whisper",
    "marble",
    "falcon",
    "quartz",
    "ember",
    "tundra",
    "velvet",
    "compass",
    "glacier",
    "saffron",
    "beacon",
    "thistle",
    "cobalt",
    "prairie",
    "ripple",
    "granite",
    "juniper",
    "nimbus",
]


def long_prompt(tokens: int, salt: str = "") -> str:
    """A prompt of about `tokens` tokens: numbered sentences of rotating words (a `salt` at its
    start makes it new to a prompt cache)."""
    sentences = []
    n = 0
    while n * 14 < tokens:
        words = [_WORDS[(n * 7 + i * 3) % len(_WORDS)] for i in range(6)]
        sentences.append(f"{n}. The {' '.join(words)}.")
        n += 1
    return f"{salt}Summarise these notes in one word.\n" + "\n".join(sentences)


RUNNING_PROMPT = "Count from 1 to 3000, separated by commas, and nothing else."


@dataclass(frozen=True)
class Pause:
    longest: float  # seconds: A's longest gap between content chunks while B was read
    b_ttft: float  # seconds: B's time to its first token
    a_chunks: int  # A's chunks during B
    a_ran_through: bool  # A was still generating when B answered (else the pause is a floor)
    b_prompt_tokens: int


def longest_pause(
    base_url: str, model: str, prompt_tokens: int, extra: dict[str, object], salt: str = ""
) -> Pause:
    """One measurement: stream A runs; after its first tokens B (a long prompt, `salt` at its
    start) is sent."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", timeout=900, max_retries=0)
    arrivals: list[float] = []
    a_done = threading.Event()
    stop = threading.Event()

    def run_a() -> None:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": RUNNING_PROMPT}],
            max_tokens=4000,
            temperature=0.0,
            stream=True,
            extra_body=extra,
        )
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append(time.perf_counter())
                if stop.is_set():
                    break
        finally:
            stream.close()
            a_done.set()

    a = threading.Thread(target=run_a, daemon=True)
    a.start()
    while len(arrivals) < 8 and not a_done.is_set():
        time.sleep(0.05)
    sent = time.perf_counter()
    b = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": long_prompt(prompt_tokens, salt)}],
        max_tokens=1,
        temperature=0.0,
        extra_body=extra,
    )
    answered = time.perf_counter()
    ran_through = not a_done.is_set()
    stop.set()
    a.join(900)
    during = [sent, *(t for t in arrivals if sent < t <= answered)]
    if ran_through:
        during.append(next((t for t in arrivals if t > answered), answered))
    gaps = [b - a for a, b in itertools.pairwise(during)]
    b_tokens = b.usage.prompt_tokens if b.usage is not None else 0
    return Pause(max(gaps, default=0.0), answered - sent, len(during) - 1, ran_through, b_tokens)


def median_pause(
    base_url: str, model: str, prompt_tokens: int, extra: dict[str, object], runs: int
) -> Pause:
    """The run with the median longest pause of `runs` runs."""
    pauses = sorted(
        (longest_pause(base_url, model, prompt_tokens, extra) for _ in range(runs)),
        key=lambda p: p.longest,
    )
    return pauses[(len(pauses) - 1) // 2]


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def exo_rss_mb(node_pid: int) -> tuple[float, float]:
    """The node process's resident MB and its runners' (every descendant), summed."""
    import psutil

    node = psutil.Process(node_pid)
    runners = sum(c.memory_info().rss for c in node.children(recursive=True)) / 2**20
    return rss_mb(node_pid), runners


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    from exo_core.testing.processes import exo_processes, wait_joined

    model = "SmolLM2-135M-Instruct"
    chunk = os.environ.get("EXO_PREFILL_CHUNK", "default")
    print(f"SmolLM2-135M, EXO_PREFILL_CHUNK={chunk}, load average {os.getloadavg()[0]:.1f}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        exo_processes(Path(tmp), 1, env={"EXO_PREFIX_CACHE_BYTES": "0"}) as (node,),
    ):
        wait_joined([node], engine="mlx")
        base = f"{node.url}/v1"
        from openai import OpenAI

        OpenAI(base_url=base, api_key="none", timeout=600).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )  # warm-up: places and loads the model
        assert node.process is not None
        pause = median_pause(base, model, args.prompt_tokens, {}, args.runs)
        time.sleep(1.0)  # an idle runner gives back freed memory after 0.5 s
        node_mb, runner_mb = exo_rss_mb(node.process.pid)
    through = "" if pause.a_ran_through else " (A ended first: a floor)"
    print(f"longest pause of a running stream  {pause.longest:8.2f} s{through}")
    print(f"  A's chunks while B was read       {pause.a_chunks:8d}")
    print(
        f"  B's time to first token           {pause.b_ttft:8.2f} s ({pause.b_prompt_tokens} tokens)"
    )
    print(f"node RSS {node_mb:.0f} MB, runner RSS {runner_mb:.0f} MB")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
