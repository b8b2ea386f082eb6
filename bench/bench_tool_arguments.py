"""What typing and streaming a tool call's arguments costs per fragment.

    .venv/bin/python bench/bench_tool_arguments.py [--chars 40000] [--fragment 4]

A call's arguments JSON (a long string argument, then many small typed ones) is cut into
fragments of `--fragment` characters, about what a token carries, and fed twice through
`ArgumentStream` as a generation does (once normalised by the family's parser, once coerced
to the tool's schema by the generation service). Prints, per fragment:
  * stream: both passes, microseconds per fragment;
  * whole: `coerce_arguments` on the whole text once, spread over the same fragments;
  * json: plain `json.loads` + `json.dumps` of the whole text, for scale;
and the ratios stream / json and whole / json. Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from exo_core.plugin.parsers import ArgumentStream
from exo_core.tool_arguments import coerce_arguments

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "body": {"type": "string"}},
    "additionalProperties": {"type": "integer"},
}


def arguments(chars: int) -> str:
    body = 'a line of "code" with unicode é and a tab\t\n' * (chars // 90)
    counts = {f"n{i}": str(i) for i in range(chars // 40)}  # integers written as strings
    return json.dumps({"path": "src/main.py", "body": body, **counts})


def best(run: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    cli = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    cli.add_argument("--chars", type=int, default=40_000, help="about this many JSON characters")
    cli.add_argument("--fragment", type=int, default=4, help="characters per fragment")
    cli.add_argument("--rounds", type=int, default=5)
    args = cli.parse_args()
    raw = arguments(args.chars)
    pieces = [raw[i : i + args.fragment] for i in range(0, len(raw), args.fragment)]

    def stream() -> None:
        parser_side, service_side = ArgumentStream(), ArgumentStream(SCHEMA)
        for piece in pieces:
            service_side.feed(parser_side.feed(piece))
        service_side.feed(parser_side.finish())
        service_side.finish()

    def whole() -> None:
        coerce_arguments(raw, SCHEMA)

    def plain() -> None:
        json.dumps(json.loads(raw))

    per = {
        name: best(run, args.rounds) / len(pieces) * 1e6
        for name, run in (("stream", stream), ("whole", whole), ("json", plain))
    }
    print(f"{'arguments':<24}{len(raw):>10} chars, {len(pieces)} fragments")
    for name, us in per.items():
        print(f"{name:<24}{us:>10.2f} us/fragment")
    print(f"{'ratio stream/json':<24}{per['stream'] / per['json']:>10.1f}x")
    print(f"{'ratio whole/json':<24}{per['whole'] / per['json']:>10.1f}x")


if __name__ == "__main__":
    main()
