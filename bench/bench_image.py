"""Image generation through exo beside mflux called directly, on the same weights.

    uv run python bench/bench_image.py [--size 128] [--steps 4] [--single-blocks 1]

Writes a tiny random-weight FLUX.1 (mflux's saved layout; widths are FLUX.1's own, only the
block counts are cut), then prints, in one run:
  * mflux directly (`Flux1.generate_image`, in a process with the runner's environment: fp32,
    the core's fast BLAS): seconds per denoising step and total seconds per image;
  * the same request through a real `exo` process (HTTP, master, worker, image runner
    subprocess): seconds per step from the streamed progress events, and total seconds of a
    non-streamed request; and the ratios exo / direct.
A 2-rank split of the transformer is not built yet, so there is no 2-rank figure.
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

MODEL_ID = "bench-flux"
PROMPT = "a lighthouse on a cliff at dusk"


def direct_mflux(model: Path, size: int, steps: int, runs: int) -> dict[str, float]:
    """mflux's own generate_image in a fresh process with the runner's environment."""
    code = f"""
import json, time
from pathlib import Path
from exo_engine_mflux.pipeline import load
loaded = load("flux1-schnell", Path({str(model)!r}))
model = loaded.model
marks = []
class Timer:
    def call_in_loop(self, t, seed, prompt, latents, config, time_steps):
        marks.append(time.perf_counter())
model.callbacks.register(Timer())
model.generate_image(seed=0, prompt={PROMPT!r}, num_inference_steps=1, height={size}, width={size})
totals, steps = [], []
for run in range({runs}):
    marks.clear()
    start = time.perf_counter()
    model.generate_image(seed=run, prompt={PROMPT!r}, num_inference_steps={steps}, height={size}, width={size})
    totals.append(time.perf_counter() - start)
    steps += [b - a for a, b in zip([start] + marks[:-1], marks)][1:]
print(json.dumps({{"total_s": min(totals), "step_s": sorted(steps)[len(steps) // 2]}}))
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


def through_exo(model: Path, root: Path, size: int, steps: int, runs: int) -> dict[str, float]:
    from exo_core.testing.processes import exo_processes, wait_until

    models = root / "node0" / "models"
    models.mkdir(parents=True)
    (models / MODEL_ID).symlink_to(model, target_is_directory=True)
    body = {
        "model": MODEL_ID,
        "prompt": PROMPT,
        "size": f"{size}x{size}",
        "advanced_params": {"seed": 0, "num_inference_steps": steps},
    }
    with exo_processes(root, 1, extra_args=[["--transport", "memory"]]) as (node,):
        url = f"{node.url}/v1/images/generations"

        def listed() -> bool:
            data = httpx.get(f"{node.url}/v1/models", timeout=5).json()["data"]
            return MODEL_ID in {m["id"] for m in data}

        wait_until(listed, timeout=120)
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
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=900) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and '"image_generation.progress"' in line:
                    marks.append(time.perf_counter())
        step_times = [b - a for a, b in zip([start, *marks[:-1]], marks, strict=True)][1:]
    return {"total_s": min(totals), "step_s": statistics.median(step_times) if step_times else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--joint-blocks", type=int, default=0)
    parser.add_argument("--single-blocks", type=int, default=1)
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
        direct = direct_mflux(model, args.size, args.steps, args.runs)
        exo = through_exo(model, Path(tmp) / "exo", args.size, args.steps, args.runs)
    print(f"{'':24}{'s/step':>10}{'total s':>10}")
    print(f"{'mflux directly':24}{direct['step_s']:>10.2f}{direct['total_s']:>10.2f}")
    print(f"{'through exo':24}{exo['step_s']:>10.2f}{exo['total_s']:>10.2f}")
    print(
        f"{'ratio exo/direct':24}{exo['step_s'] / direct['step_s']:>10.2f}"
        f"{exo['total_s'] / direct['total_s']:>10.2f}"
    )
    print("2 ranks beside 1: not measured (the transformer split is not built yet)")


if __name__ == "__main__":
    main()
