"""One rank of a split generation, as a process: for the 2-rank test and the benchmark.

    MLX_HOSTFILE=ring.json MLX_RANK=0 python -m exo_engine_mflux.split_run MODEL OUT \
        [--size 64] [--steps 2] [--seed 7] [--reference]

Joins the ring of MLX_HOSTFILE (or runs alone without it), takes an even share of the
transformer's blocks, generates one image and writes `OUT.png` and `OUT.json` (seconds per
image and per step). `--reference` first writes the unsplit image as `OUT-reference.png`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import mlx.core as mx

from exo_engine_mflux import pipeline
from exo_engine_mflux.split import even_blocks, split_transformer

PROMPT = "a lighthouse on a cliff at dusk"


def _generate(
    loaded: pipeline.LoadedModel, size: int, steps: int, seed: int
) -> tuple[bytes, dict[str, float]]:
    marks: list[float] = []
    start = time.perf_counter()
    image = pipeline.generate(
        loaded,
        prompt=PROMPT,
        seed=seed,
        width=size,
        height=size,
        steps=steps,
        guidance=0.0,
        negative_prompt=None,
        input_image=None,
        on_step=lambda step: marks.append(time.perf_counter()),
    )
    total = time.perf_counter() - start
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    step_s = sorted(gaps)[len(gaps) // 2] if gaps else total
    return pipeline.encode_image(image, "png", 100), {"total_s": total, "step_s": step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description="one rank of a split image generation")
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    # The ring first: a peer gives up connecting when this rank is late.
    ring = bool(os.environ.get("MLX_HOSTFILE"))
    group = mx.distributed.init(strict=ring, backend="ring" if ring else "any")
    loaded = pipeline.load("flux1-schnell", args.model)
    if args.reference:
        png, _ = _generate(loaded, args.size, args.steps, args.seed)
        args.out.with_name(args.out.name + "-reference.png").write_bytes(png)
    transformer = loaded.model.transformer
    n_blocks = len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks)
    start, end = even_blocks(n_blocks, group.rank(), group.size())
    split_transformer(loaded.model, group, start, end)
    _generate(loaded, args.size, 1, args.seed)  # warm-up: the first step compiles and allocates
    png, timing = _generate(loaded, args.size, args.steps, args.seed)
    args.out.with_name(args.out.name + ".png").write_bytes(png)
    timing |= {"rank": group.rank(), "size": group.size(), "blocks": end - start}
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(timing))


if __name__ == "__main__":
    main()
