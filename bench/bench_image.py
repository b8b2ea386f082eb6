"""Image generation through exo beside mflux called directly, on the same weights.

    uv run python bench/bench_image.py [--size 128] [--steps 4] [--joint-blocks 0] [--single-blocks 2]

Writes a tiny random-weight FLUX.1 (mflux's saved layout; the transformer's widths are FLUX.1's
own with the block counts cut, the VAE is 8x narrower), then prints, in one run:
  * mflux directly, in a process with the runner's environment (fp32, the core's fast BLAS and
    thread count) through the runner's own `pipeline.generate`, before and after exo, best of
    both: seconds per denoising step and total seconds per image;
  * the same request through one real `exo` process (HTTP, master, worker, image runner
    subprocess): seconds per step from the streamed progress events, total seconds of a
    non-streamed request; and the ratios exo / direct;
  * the same through two `exo` processes (libp2p on 127.0.0.1) holding one 2-rank instance:
    the transformer's blocks split over a runner group. On one machine both ranks share its
    cores (and each runs the encoders and the VAE), so this shows the split's overhead, not
    the speed of two machines.
Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from exo_core.testing.processes import (
    ExoProcess,
    exo_processes,
    runners_ready,
    wait_joined,
    wait_until,
)

MODEL_ID = "bench-flux"
PROMPT = "a lighthouse on a cliff at dusk"


def direct_mflux(model: Path, size: int, steps: int, runs: int) -> dict[str, float]:
    """mflux in a fresh process with the runner's environment (`image_runner_env`: fp32, the
    core's fast BLAS by LD_PRELOAD and its thread count), through the runner's own
    `pipeline.generate` (mflux's `generate_image` with the runner's step callback), so the
    only difference from exo is exo itself."""
    code = f"""
import json, time
from pathlib import Path
from exo_core.blas import loaded_blas
from exo_engine_mflux import pipeline
loaded = pipeline.load("flux1-schnell", Path({str(model)!r}))
marks = []
def run(seed, steps):
    return pipeline.generate(loaded, prompt={PROMPT!r}, seed=seed, width={size}, height={size},
        steps=steps, guidance=0.0, negative_prompt=None, input_image=None,
        on_step=lambda step: marks.append(time.perf_counter()))
run(0, 1)
totals, steps = [], []
for seed in range({runs}):
    marks.clear()
    start = time.perf_counter()
    run(seed, {steps})
    totals.append(time.perf_counter() - start)
    steps += [b - a for a, b in zip([start] + marks[:-1], marks)][1:]
print(json.dumps({{"total_s": min(totals), "step_s": sorted(steps)[len(steps) // 2],
                   "blas": loaded_blas() or "reference"}}))
"""
    from exo_engine_mflux.engine import image_runner_env

    out = subprocess.run(
        [sys.executable, "-c", code],
        env=image_runner_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _runner_memory(node: ExoProcess, instance_id: str) -> list[float]:
    """Resident MB of each rank's runner (node telemetry), in rank order; 0 before a report."""
    state = node.state()
    shards = sorted(state["instances"][instance_id]["shards"], key=lambda s: s["rank"])
    reported = [
        state["nodes"][s["node_id"]]["resources"].get("runner_memory", {}).get(s["runner_id"], 0)
        for s in shards
    ]
    return [m / 1e6 for m in reported]


def through_exo(
    model: Path, root: Path, ranks: int, size: int, steps: int, runs: int
) -> dict[str, float]:
    """The request through `ranks` real `exo` processes (libp2p on 127.0.0.1; an instance of
    `ranks` nodes: with 2, the transformer split over a runner group)."""
    for i in range(ranks):
        models = root / f"node{i}" / "models"
        models.mkdir(parents=True)
        (models / MODEL_ID).symlink_to(model, target_is_directory=True)
    body = {"model": MODEL_ID, "prompt": PROMPT, "size": f"{size}x{size}"}
    extra = [["--no-auto-place"]] * ranks
    with exo_processes(root, ranks, extra_args=extra) as nodes:
        node = nodes[0]
        wait_joined(nodes, engine="mflux")
        placed = httpx.post(
            f"{node.url}/instance", json={"model_id": MODEL_ID, "min_nodes": ranks}, timeout=60
        )
        placed.raise_for_status()
        instance_id = placed.json()["instance_id"]
        wait_until(lambda: runners_ready(node, instance_id), timeout=900)
        url = f"{node.url}/v1/images/generations"
        httpx.post(url, json={**body, "advanced_params": {"num_inference_steps": 1}}, timeout=900)
        totals = []
        for run in range(runs):
            start = time.perf_counter()
            answer = httpx.post(
                url,
                json={**body, "advanced_params": {"seed": run, "num_inference_steps": steps}},
                timeout=900,
            )
            answer.raise_for_status()
            totals.append(time.perf_counter() - start)
        marks: list[float] = []
        start = time.perf_counter()
        streamed = {**body, "stream": True, "advanced_params": {"num_inference_steps": steps}}
        with httpx.stream("POST", url, json=streamed, timeout=900) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and '"image_generation.progress"' in line:
                    marks.append(time.perf_counter())
        step_times = [b - a for a, b in zip([start, *marks[:-1]], marks, strict=True)][1:]
        memory = _runner_memory(node, instance_id)
    return {
        "total_s": min(totals),
        "step_s": statistics.median(step_times) if step_times else 0.0,
        "rank_mb": max(memory),
    }


def _row(name: str, figures: dict[str, float]) -> str:
    return f"{name:24}{figures['step_s']:>10.2f}{figures['total_s']:>10.2f}"


def _ratio(name: str, a: dict[str, float], b: dict[str, float]) -> str:
    return f"{name:24}{a['step_s'] / b['step_s']:>10.2f}{a['total_s'] / b['total_s']:>10.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--joint-blocks", type=int, default=0)
    parser.add_argument("--single-blocks", type=int, default=2)
    args = parser.parse_args()
    from exo_engine_mflux.tiny_model import write_tiny_model_with_card

    with tempfile.TemporaryDirectory(prefix="exo-bench-image-") as tmp:
        model = write_tiny_model_with_card(
            Path(tmp) / MODEL_ID,
            MODEL_ID,
            joint_blocks=args.joint_blocks,
            single_blocks=args.single_blocks,
        )
        print(
            f"tiny FLUX.1: {args.joint_blocks} joint + {args.single_blocks} single blocks, "
            f"{args.size}x{args.size}, {args.steps} steps, best of {args.runs}"
        )
        # mflux directly before and after exo, the best of each figure: the load of a busy
        # machine at one moment then weighs on neither side alone.
        before = direct_mflux(model, args.size, args.steps, args.runs)
        one = through_exo(model, Path(tmp) / "exo1", 1, args.size, args.steps, args.runs)
        after = direct_mflux(model, args.size, args.steps, args.runs)
        two = through_exo(model, Path(tmp) / "exo2", 2, args.size, args.steps, args.runs)
        direct = {key: min(before[key], after[key]) for key in ("step_s", "total_s")}
    print(f"BLAS of the direct process: {before['blas']}")
    print(f"{'':24}{'s/step':>10}{'total s':>10}")
    print(_row("mflux directly", direct))
    print(_row("exo, 1 node", one))
    print(_ratio("ratio exo/direct", one, direct))
    print(_row("exo, 2 ranks (1 machine)", two))
    print(_ratio("ratio 2 ranks/1 node", two, one))
    print(
        f"runner memory (resident, largest rank): 1 node {one['rank_mb']:.0f} MB, "
        f"2 ranks {two['rank_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
