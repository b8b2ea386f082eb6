"""Runner groups on this machine: decode speed of a 2-rank pipeline and a 3-rank tensor group
against a single runner, on the embedded SmolLM2, and how fast a broken group reports.

    uv run python bench/bench_distributed.py [--tokens 96] [--streams 1,4]

All ranks run on this one machine (127.0.0.1), so they share its cores: the ratios show the
cost of the exchanges and of the duplicated work, not what separate machines would gain.
Prints figures and ratios; never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exo_core.generation import FinishChunk, TextChunk
from exo_core.state import Sharding
from exo_engine_mlx.distributed.testing import (
    RunnerGroup,
    group_specs,
    running_group,
    task,
)
from exo_engine_mlx.protocol import RunnerOptions

PROMPT = "Write a short story about a robot who learns to paint."


def decode_tps(model_dir: Path, sharding: Sharding, world: int, tokens: int, streams: int) -> float:
    """Aggregate decode tok/s of `streams` concurrent greedy generations (median of 3 runs)."""
    rates = []
    with running_group(group_specs(model_dir, sharding=sharding, world=world)) as group:
        for run in range(3):
            tasks = [
                task(f"s{run}-{i}", f"{PROMPT} ({i})", max_tokens=tokens) for i in range(streams)
            ]
            results = group.generate_many(tasks, ranks=[0])
            total = 0.0
            for by_rank in results.values():
                last = by_rank[0][-1]
                assert isinstance(last, FinishChunk), last
                total += last.usage.generation_tps
            rates.append(total)
    return statistics.median(rates)


def failure_times(model_dir: Path) -> dict[str, float]:
    """Seconds until a caller hears of a killed rank, and until a group missing a peer gives
    up (with a 5 s connect deadline, plus the runner's start)."""
    out: dict[str, float] = {}
    with running_group(group_specs(model_dir, sharding="pipeline", world=2)) as group:
        killed: list[float] = []

        def on_chunk(rank: int, chunk: object) -> None:
            if rank == 0 and isinstance(chunk, TextChunk) and not killed:
                group.kill(1)
                killed.append(time.monotonic())

        group.generate(task("doomed", max_tokens=100_000), on_chunk=on_chunk, ranks=[0])
        out["killed rank -> caller's error (s)"] = time.monotonic() - killed[0]
    options = RunnerOptions(group_connect_timeout_s=5.0)
    start = time.monotonic()
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    with RunnerGroup(specs, options=options, ranks=[0]) as group:
        group.wait(lambda: 0 in group.died, 60.0, "the group did not give up")
        out["peer never starts -> runner error, 5 s deadline (s)"] = time.monotonic() - start
    return out


_LATENCY = """
import json, sys, time
import mlx.core as mx
group = mx.distributed.init(backend="ring", strict=True)
x = mx.ones((1, 1, 576))  # one token's hidden state of SmolLM2
for _ in range(20):
    mx.eval(mx.distributed.all_sum(x, group=group))
start = time.perf_counter()
for _ in range(200):
    mx.eval(mx.distributed.all_sum(x, group=group))
if group.rank() == 0:
    print(json.dumps((time.perf_counter() - start) / 200))
"""


def all_sum_latency(world: int) -> float:
    """Seconds per all_sum of one hidden state over `world` processes on 127.0.0.1 (a tensor
    group does two per layer and token)."""
    from exo_engine_mlx.distributed.testing import free_ports

    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(world)]))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _LATENCY],
                env={**os.environ, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(rank)},
                stdout=subprocess.PIPE,
                text=True,
            )
            for rank in range(world)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    return float(json.loads(outputs[0].strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--streams", default="1,4")
    args = parser.parse_args()
    from exo_engine_mlx.embedded import ensure_embedded_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = ensure_embedded_model(Path(tmp))
        setups: list[tuple[str, Sharding, int]] = [
            ("single runner", "pipeline", 1),
            ("2-rank pipeline", "pipeline", 2),
            ("3-rank tensor", "tensor", 3),
        ]
        for streams in [int(s) for s in args.streams.split(",")]:
            print(f"\ndecode tok/s, {streams} stream(s), {args.tokens} tokens, greedy:")
            base = None
            for name, sharding, world in setups:
                tps = decode_tps(model_dir, sharding, world, args.tokens, streams)
                base = base or tps
                print(f"  {name:16s} {tps:7.2f} tok/s   ratio to single {tps / base:5.2f}")
        print("\nall_sum of one hidden state (2.3 KB) on 127.0.0.1:")
        for world in (2, 3):
            print(f"  {world} processes {all_sum_latency(world) * 1e3:8.2f} ms")
        print("\nfailures:")
        for what, seconds in failure_times(model_dir).items():
            print(f"  {what:55s} {seconds:6.2f}")


if __name__ == "__main__":
    main()
