"""What reading gpt-oss's Harmony output through openai-harmony costs per token.

    uv run python bench/bench_harmony.py [--tokens 2000]

A recorded-style answer (analysis, a tool call, a final answer) is cut into one piece per
o200k_harmony token, as the runner's text stream hands it over, and fed to the engine's
`HarmonyParser` (the package's `StreamableParser` after re-encoding each piece). Prints:
  * load: loading the encoding once per process (the vocabulary unpacked and hash-checked);
  * parser: setting up one request's parser (the prompt's open header fed);
  * harmony: microseconds per token through the parser;
  * think: the same text through the core's `ThinkParser` (a plain tag scan), for scale;
  * render: one gpt-oss prompt with tools and an earlier call, rendered by the package;
and the ratio harmony / think. Never asserts on time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from exo_core.plugin import ChatMessage, GenerationParams, TaskId, TextChunk, ToolCall, ToolSpec
from exo_core.plugin.parsers import OutputParser, ThinkParser
from exo_engine_mlx.harmony import HarmonyParser
from exo_engine_mlx.harmony_encoding import harmony_encoding
from exo_engine_mlx.harmony_prompt import render_harmony

TASK = TaskId("bench")
PROMPT = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"


def answer(words: int) -> str:
    thought = " ".join(["the user asks about the weather in Paris, so I call the tool"] * words)
    final = " ".join(["It is sunny in Paris today, 21 degrees."] * words)
    return (
        f"<|channel|>analysis<|message|>{thought}<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
        f"<|start|>assistant<|channel|>final<|message|>{final}"
    )


def per_token(make: Callable[[], OutputParser], pieces: list[str]) -> float:
    best = float("inf")
    for _ in range(3):
        parser = make()
        start = time.perf_counter()
        for piece in pieces:
            parser.feed(TextChunk(task_id=TASK, text=piece))
        parser.finish(TASK)
        best = min(best, time.perf_counter() - start)
    return best / len(pieces) * 1e6


def main() -> None:
    cli = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    cli.add_argument("--tokens", type=int, default=2000, help="about this many answer tokens")
    args = cli.parse_args()
    start = time.perf_counter()
    encoding = harmony_encoding()
    load = time.perf_counter() - start
    text = answer(max(1, args.tokens // 26))
    pieces = [encoding.decode([t]) for t in encoding.encode(text, allowed_special="all")]
    start = time.perf_counter()
    for _ in range(20):
        HarmonyParser(True, PROMPT)
    setup = (time.perf_counter() - start) / 20
    harmony = per_token(lambda: HarmonyParser(True, PROMPT), pieces)
    think = per_token(lambda: ThinkParser("<think>", "</think>"), pieces)
    params = GenerationParams(
        messages=(
            ChatMessage(role="user", content="Weather in Paris?"),
            ChatMessage(
                role="assistant",
                tool_calls=(ToolCall(id="a", name="get_weather", arguments='{"city": "Paris"}'),),
            ),
            ChatMessage(role="tool", tool_call_id="a", content="sunny, 21 C"),
        ),
        tools=(ToolSpec(name="get_weather", description="The weather", parameters={}),),
        reasoning_effort="high",
    )
    start = time.perf_counter()
    for _ in range(20):
        render_harmony(params)
    render = (time.perf_counter() - start) / 20
    print(f"answer tokens           {len(pieces)}")
    print(f"load (once per process) {load * 1e3:8.1f} ms")
    print(f"parser (per request)    {setup * 1e3:8.2f} ms")
    print(f"harmony                 {harmony:8.1f} us/token")
    print(f"think (plain tag scan)  {think:8.1f} us/token")
    print(f"ratio harmony/think     {harmony / think:8.1f}x")
    print(f"render (per request)    {render * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
