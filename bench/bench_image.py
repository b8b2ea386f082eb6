"""Image generation through exo beside mflux called directly, on the same weights.

    uv run python bench/bench_image.py [--size 128] [--steps 4] [--joint-blocks 1] [--single-blocks 1]

Writes a tiny random-weight FLUX.1 (mflux's saved layout; the transformer's widths are FLUX.1's
own with the block counts cut, the VAE is 8x narrower), then prints, in one run:
  * mflux directly (`Flux1.generate_image`, in a process with the runner's environment: fp32,
    the core's fast BLAS), before and after exo, best of both: seconds per denoising step and
    total seconds per image;
  * the same request through a real `exo` process (HTTP, master, worker, image runner
    subprocess): seconds per step from the streamed progress events, and total seconds of a
    non-streamed request; and the ratios exo / direct.
  * the transformer split over 2 ranks (two processes joined by mx.distributed's ring on
    127.0.0.1, `exo_engine_mflux.split_run`) beside 1 rank: seconds per step and per image.
    On one machine both ranks share its cores, so this shows the split's overhead, not the
    speed of two machines (the split is not wired into exo's runners yet: measured directly).
    With the default single block, rank 1 holds none: pass `--joint-blocks 1` to split two.
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


def split_ranks(model: Path, root: Path, ranks: int, size: int, steps: int) -> dict[str, float]:
    """One split generation over `ranks` processes; rank 0's seconds per step and image."""
    from exo_core.testing.harness import free_port
    from exo_engine_mflux.engine import image_runner_env

    env = image_runner_env()
    if ranks > 1:
        hostfile = root / f"ring-{ranks}.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
        env["MLX_HOSTFILE"] = str(hostfile)
    out = root / f"split-{ranks}"
    args = ["--size", str(size), "--steps", str(steps)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "exo_engine_mflux.split_run", str(model), f"{out}-{r}", *args],
            env=env | {"MLX_RANK": str(r)},
        )
        for r in range(ranks)
    ]
    if any(p.wait(timeout=1800) for p in procs):
        raise RuntimeError(f"a rank of the {ranks}-rank split failed")
    return json.loads(out.with_name(f"{out.name}-0.json").read_text())


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
        # mflux directly before and after exo, the best of each figure: the load of a busy
        # machine at one moment then weighs on neither side alone.
        before = direct_mflux(model, args.size, args.steps, args.runs)
        exo = through_exo(model, Path(tmp) / "exo", args.size, args.steps, args.runs)
        after = direct_mflux(model, args.size, args.steps, args.runs)
        direct = {key: min(before[key], after[key]) for key in ("step_s", "total_s")}
        one, two = (split_ranks(model, Path(tmp), r, args.size, args.steps) for r in (1, 2))
    print(f"{'':24}{'s/step':>10}{'total s':>10}")
    print(f"{'mflux directly':24}{direct['step_s']:>10.2f}{direct['total_s']:>10.2f}")
    print(f"{'through exo':24}{exo['step_s']:>10.2f}{exo['total_s']:>10.2f}")
    print(
        f"{'ratio exo/direct':24}{exo['step_s'] / direct['step_s']:>10.2f}"
        f"{exo['total_s'] / direct['total_s']:>10.2f}"
    )
    print(f"{'1 rank (split_run)':24}{one['step_s']:>10.2f}{one['total_s']:>10.2f}")
    print(f"{'2 ranks, one machine':24}{two['step_s']:>10.2f}{two['total_s']:>10.2f}")
    print(
        f"{'ratio 2 ranks/1 rank':24}{two['step_s'] / one['step_s']:>10.2f}"
        f"{two['total_s'] / one['total_s']:>10.2f}"
    )


if __name__ == "__main__":
    main()
