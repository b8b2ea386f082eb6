"""When is reusing a stored prefix worth it? The prefix cache's reuse rule, measured.

    uv run python bench/bench_prefix_cache.py [--lengths 128 512] [--family gemma3_text]

On the embedded SmolLM2 (or, with --family, a tiny random-weight model of that family: e.g.
gemma3_text for rotating sliding-window caches, nemotron_h or qwen3_next for SSM state caches),
in a process with a runner's environment (its BLAS and kernels), for prompts of each length P
and a stored prefix of n tokens, prints side by side:
  * fresh: prefill all P tokens into a new cache;
  * reused: `PrefixCache.lookup` (a private copy of the stored cache) plus prefilling the
    P - n tokens left;
  * copy: the lookup alone (the cost reuse adds);
and the ratio fresh / reused. The engine reuses any stored prefix of at least
`PrefixCache.min_tokens` tokens: the row with the smallest n says whether that threshold pays.

    uv run python bench/bench_prefix_cache.py --solo [--lengths 256 1024] [--hidden 1024]
                                              [--chunk 8192]

The solo path (`SoloGenerator`, one cache per request), on a tiny random llama4 of the given
width (4 layers, head_dim 128) with its chunked attention: a stored request of P tokens, then
a request of P tokens sharing its first n, time to first token (lookup, copy, prefill of the
rest, first decode step, as the engine steps it):
  * fresh: no prefix cache;
  * reused: the stored request's cache, cut back to n.
A chunked cache is cut back no further than the first chunk it holds whole: with --chunk below
P, the rows under that cut miss (`hit` says how many tokens were reused).
Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = """
import json, random, sys, time
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from exo_engine_mlx.loading import load_model
from exo_engine_mlx.prefix_cache import PrefixCache

model_dir, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
low, high = int(sys.argv[3]), int(sys.argv[4])  # the token ids drawn
model, _ = load_model(model_dir)
rng = random.Random(0)
STEP = 512

def prefill(tokens, cache):
    for i in range(0, len(tokens), STEP):
        logits = model(mx.array(tokens[i : i + STEP])[None], cache=cache)
        mx.eval(logits, [c.state for c in cache])

def best(run, reps=3):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)

prefill([1, 2, 3, 4], make_prompt_cache(model))  # warm up
rows = []
for length in lengths:
    tokens = [rng.randrange(low, high) for _ in range(length)]
    fresh = best(lambda: prefill(tokens, make_prompt_cache(model)))
    for n in sorted({8, 32, length // 4, length // 2, 3 * length // 4, length - 8}):
        stored = make_prompt_cache(model)
        prefill(tokens[:n], stored)
        cache = PrefixCache(budget_bytes=1 << 34, min_tokens=1)
        cache.store(tokens[:n], stored)
        copy = best(lambda: cache.lookup(tokens))

        def reuse():
            hit, got = cache.lookup(tokens)
            assert hit is not None and got == n
            prefill(tokens[n:], hit)

        rows.append({"length": length, "n": n, "fresh": fresh, "reused": best(reuse), "copy": copy})
print(json.dumps(rows))
"""


SOLO_CHILD = """
import json, random, sys, time
from exo_engine_mlx.generation_solo import SoloGenerator
from exo_engine_mlx.loading import load_model
from exo_engine_mlx.prefix_cache import PrefixCache, shortest_cut

model_dir, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
low, high = int(sys.argv[3]), int(sys.argv[4])
model, _ = load_model(model_dir)
rng = random.Random(0)

def first_token(tokens, prefix):
    \"\"\"One request on the solo path until its first token: seconds, tokens reused, and
    the finished request's response (its cache).\"\"\"
    generator = SoloGenerator(model, stop_tokens=[], prefill_step_size=512)
    start = time.perf_counter()
    cache, n = prefix.lookup(tokens)
    generator.insert(
        [tokens[n:]], [1], caches=None if cache is None else [cache], all_tokens=[tokens[:n]]
    )
    while True:
        _, generated = generator.next()
        if generated:
            return time.perf_counter() - start, n, generated[0]

def best(run, reps=3):
    runs = [run() for _ in range(reps)]
    return min(r[0] for r in runs), runs[0][1]

def draw(n):
    return [rng.randrange(low, high) for _ in range(n)]

first_token(draw(8), PrefixCache(0))  # warm up
rows = []
for length in lengths:
    tokens = draw(length)
    fresh, _ = best(lambda: first_token(tokens, PrefixCache(0)))
    prefix = PrefixCache(budget_bytes=1 << 34, min_tokens=1)
    _, _, done = first_token(tokens, prefix)  # the stored request: P tokens and one answer
    prefix.store(done.all_tokens, done.prompt_cache)
    cut = shortest_cut(done.prompt_cache, len(done.all_tokens))
    for n in sorted({length // 4, length // 2, 3 * length // 4, length - 8}):
        other = tokens[:n] + draw(length - n)
        reused, hit = best(lambda: first_token(other, prefix))
        rows.append(
            {"length": length, "n": n, "hit": hit, "cut": cut, "fresh": fresh, "reused": reused}
        )
print(json.dumps(rows))
"""


def _tiny_llama4(out: Path, hidden: int, chunk: int) -> tuple[Path, int, int, str]:
    """A random llama4 of `hidden` width (head_dim 128, as the real ones), 4 layers."""
    from exo_engine_mlx.tiny_model import TINY_FAMILIES, make_tiny_model

    text = {
        **TINY_FAMILIES["llama4"]["text_config"],
        "attention_chunk_size": chunk,
        "head_dim": 128,
        "intermediate_size_mlp": 4 * hidden,
    }
    heads = max(1, hidden // 128)
    make_tiny_model(
        out,
        model_type="llama4",
        layers=4,
        hidden=hidden,
        heads=heads,
        kv_heads=max(1, heads // 4),
        intermediate=2 * hidden,
        overrides={"text_config": text},
    )
    name = f"random llama4 (4 layers, hidden {hidden}, {heads} heads, attention chunk {chunk})"
    return out, 0, 390, name


def _child_rows(code: str, model_dir: Path, lengths: list[int], low: int, high: int) -> Any:
    """The measurements of `code` run in a runner-like process (the runner's environment: its
    fast BLAS preloaded), from the JSON on its last line of output."""
    from exo_core.plugin.engine import runner_env

    argv = [str(model_dir), ",".join(str(n) for n in lengths), str(low), str(high)]
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=runner_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _solo(args: argparse.Namespace) -> None:
    from exo_core.plugin.engine import find_fast_blas

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, low, high, name = _tiny_llama4(Path(tmp) / "llama4", args.hidden, args.chunk)
        rows = _child_rows(SOLO_CHILD, model_dir, args.lengths, low, high)
    print(f"solo path, {name}, BLAS={find_fast_blas() or 'bundled'}")
    print("time to first token, best of 3, seconds; stored: a request of P tokens\n")
    print(
        f"{'prompt':>7} {'shared':>7} {'cut>=':>6} {'hit':>6} {'fresh':>8} {'reused':>8} "
        f"{'fresh/reused':>13}"
    )
    for r in rows:
        ratio = r["fresh"] / r["reused"]
        print(
            f"{r['length']:>7} {r['n']:>7} {r['cut']:>6} {r['hit']:>6} {r['fresh']:>8.3f} "
            f"{r['reused']:>8.3f} {ratio:>12.2f}x"
        )


def _tiny(out: Path, family: str, window: int) -> tuple[Path, int, int, str]:
    """A tiny random model of `family`, wide enough that prefill takes measurable time."""
    from exo_engine_mlx.tiny_model import TINY_FAMILIES, make_tiny_model

    overrides = {"sliding_window": window} if "sliding_window" in TINY_FAMILIES[family] else {}
    make_tiny_model(
        out, model_type=family, layers=4, hidden=256, intermediate=512, overrides=overrides
    )
    shown = f" window {window}" if overrides else ""
    return out, 0, 390, f"tiny random {family} (4 layers, hidden 256{shown})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--family", help="a tiny random model of this model_type instead")
    parser.add_argument("--window", type=int, default=128, help="its sliding window, if any")
    parser.add_argument("--solo", action="store_true", help="the solo path, on a random llama4")
    parser.add_argument("--hidden", type=int, default=1024, help="--solo: the llama4's width")
    parser.add_argument("--chunk", type=int, default=8192, help="--solo: its attention chunk")
    args = parser.parse_args()
    if args.solo:
        _solo(args)
        return

    from exo_core.plugin.engine import find_fast_blas
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.prefix_cache import PrefixCache

    with tempfile.TemporaryDirectory() as tmp:
        if args.family:
            model_dir, low, high, name = _tiny(Path(tmp) / "tiny", args.family, args.window)
        else:
            model_dir = ensure_embedded_model(Path(tmp) / "models")
            low, high, name = 1000, 40000, "SmolLM2-135M"
        rows = _child_rows(CHILD, model_dir, args.lengths, low, high)
    threshold = PrefixCache(budget_bytes=0).min_tokens
    print(f"{name}, BLAS={find_fast_blas() or 'bundled'}, best of 3, seconds")
    print(f"the engine reuses a stored prefix of >= {threshold} tokens\n")
    print(
        f"{'prompt':>7} {'stored':>7} {'fresh':>8} {'reused':>8} {'copy':>8} {'fresh/reused':>13}"
    )
    for r in rows:
        ratio = r["fresh"] / r["reused"]
        print(
            f"{r['length']:>7} {r['n']:>7} {r['fresh']:>8.3f} {r['reused']:>8.3f} "
            f"{r['copy']:>8.4f} {ratio:>12.2f}x"
        )


if __name__ == "__main__":
    main()
