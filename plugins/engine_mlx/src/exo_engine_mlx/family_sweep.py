"""Every family mlx-lm runs, on tiny models: one rank generates, and one 2-rank ring splits
every family the engine says it splits, for the sweep tests.

`generate` runs one greedy request through the engine's own `BatchEngine`. `run_sweep` starts
ONE pair of rank processes (`python -m exo_engine_mlx.family_sweep`) on a real
`mx.distributed` ring, formed as a runner group forms it (hostfile, ring token, membership
proof); the pair then loops over every case: each rank loads its part of the family's tiny
model with the engine's `load_model(path, ShardPlan(...))` (pipeline: uneven layers 1 + 3) and
generates with a `BatchEngine`, in step with the other rank as a group's warm-up does; rank 0
writes the text. A pair per family would pay process start, imports and the ring's setup
~80 times.

A case whose load fails on any rank is reported as that rank's error and skipped by both
ranks (they agree on it first). A case that hangs (a rank waiting in a collective its peer
never enters) ends the process pair after `CASE_TIMEOUT_S`; the case it was in is reported.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    ErrorChunk,
    FinishChunk,
    GenerationParams,
    ModelCard,
    ModelId,
    SamplingParams,
    TaskId,
    TextChunk,
)
from exo_core.plugin.engine import RING_TOKEN_ENV, any_rank

# The tiny models of the sweep: four layers, so a pipeline can give its ranks 1 and 3.
LAYERS = 4
PIPELINE_COUNTS = (1, 3)
PROMPT = "hello world"
MAX_TOKENS = 6
# One case (load and a few tokens of a tiny model) takes well under a second alone; a hung
# collective is ended after this.
CASE_TIMEOUT_S = 60.0


def tiny_card(model_type: str, n_layers: int = LAYERS) -> ModelCard:
    """A card for a tiny `model_type` model, as placement sees it."""
    return ModelCard(
        model_id=ModelId(f"x/{model_type}"),
        family=model_type,
        model_type=model_type,
        n_layers=n_layers,
        hidden_size=64,
        storage_size_bytes=1,
        source="hf:x/y",
    )


@dataclass(frozen=True)
class Generated:
    text: str
    final: FinishChunk | ErrorChunk | None  # None: the stream ended without a final chunk


def generate(
    model: Any, tokenizer: Any, max_tokens: int = MAX_TOKENS, batched: bool | None = None
) -> Generated:
    """One greedy request of `PROMPT` through the engine's batch engine (`batched`: as
    `BatchEngine` takes it; a group passes its ranks' common answer)."""
    from exo_engine_mlx.batching import BatchEngine

    engine = BatchEngine(model, tokenizer, max_concurrent=1, batched=batched)
    params = GenerationParams(
        messages=(ChatMessage(role="user", content=PROMPT),),
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
    )
    chunks: list[Chunk] = list(engine.submit(TaskId("sweep"), params))
    while engine.active:
        chunks.extend(engine.step())
    text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
    last = chunks[-1] if chunks else None
    return Generated(text, last if isinstance(last, FinishChunk | ErrorChunk) else None)


@dataclass(frozen=True)
class OneRank:
    """A family's tiny model on one rank: its greedy text, and how the engine would split
    the loaded model (what placement is told must match this)."""

    generated: Generated
    pipeline: str | None  # `distributed.pipeline.pipeline_method` of the loaded model
    tensor: bool  # the loaded model has mlx-lm's shard()


@dataclass
class TinyFamilies:
    """Each family's tiny model (`LAYERS` layers), built under `root` once, and its one-rank
    generation, run once: shared by the sweep tests through a session fixture."""

    root: Path
    _paths: dict[str, Path] = field(default_factory=dict)
    _one_rank: dict[str, OneRank] = field(default_factory=dict)

    def path(self, model_type: str) -> Path:
        if model_type not in self._paths:
            from exo_engine_mlx.tiny_model import make_tiny_model

            self._paths[model_type] = make_tiny_model(
                self.root / model_type, model_type=model_type, layers=LAYERS
            )
        return self._paths[model_type]

    def one_rank(self, model_type: str) -> OneRank:
        if model_type not in self._one_rank:
            import mlx.core as mx

            from exo_engine_mlx.distributed.pipeline import pipeline_method
            from exo_engine_mlx.loading import load_model

            model, tokenizer = load_model(str(self.path(model_type)))
            self._one_rank[model_type] = OneRank(
                generate(model, tokenizer),
                pipeline_method(model),
                callable(getattr(model, "shard", None)),
            )
            del model, tokenizer
            mx.clear_cache()
        return self._one_rank[model_type]


Sharding = Literal["pipeline", "tensor"]


@dataclass(frozen=True)
class Case:
    model_type: str
    sharding: Sharding
    path: str

    @property
    def key(self) -> str:
        return f"{self.model_type}/{self.sharding}"


@dataclass(frozen=True)
class CaseResult:
    text: str = ""
    error: str = ""  # why the case did not generate (a load error, a crash, a hang)


def _plan(sharding: Sharding, rank: int, group: Any) -> Any:
    from exo_engine_mlx.loading import ShardPlan

    if sharding == "tensor":
        return ShardPlan(sharding="tensor", group=group)
    start = sum(PIPELINE_COUNTS[:rank])
    return ShardPlan(
        sharding="pipeline",
        group=group,
        start_layer=start,
        end_layer=start + PIPELINE_COUNTS[rank],
        layer_counts=PIPELINE_COUNTS,
    )


def _all_loaded(group: Any, ok: bool) -> bool:
    """Whether every rank is `ok` (loaded its part, finished its generation); a barrier."""
    return not any_rank(group, not ok)


def _run_case(case: Case, rank: int, group: Any) -> CaseResult:
    import mlx.core as mx

    from exo_engine_mlx.loading import load_model

    try:
        model, tokenizer = load_model(case.path, _plan(case.sharding, rank, group))
        error = ""
    except Exception as e:
        model = tokenizer = None
        error = f"rank {rank} could not load its part: {type(e).__name__}: {e}"
    if not _all_loaded(group, not error):
        return CaseResult(error=error or "another rank could not load its part")
    from exo_engine_mlx.generation_solo import can_batch

    # As a runner group does: one cache per request on every rank if any rank needs it.
    out = generate(model, tokenizer, batched=not any_rank(group, not can_batch(model)))
    del model, tokenizer
    mx.clear_cache()
    finished = isinstance(out.final, FinishChunk)
    # Both ranks learn whether the other finished (a barrier before the next case, too).
    if not _all_loaded(group, finished) and finished:
        return CaseResult(out.text, "another rank did not finish")
    if not finished:
        return CaseResult(out.text, f"rank {rank} ended with {out.final!r} (see its log)")
    return CaseResult(out.text)


def rank_main(job_path: str, rank: int) -> None:
    """A rank of the sweep's pair: join the ring, then run every case of the job in order.
    Rank 0 appends a line per case to the job's output: "start" first, then the result."""
    from loguru import logger

    from exo_core.plugin.engine import RunnerSpec, join_group

    # Short tracebacks: loguru's default (every frame's values) can take minutes on arrays.
    logger.remove()
    logger.add(sys.stderr, level="WARNING", backtrace=False, diagnose=False)
    job = json.loads(Path(job_path).read_text())
    import msgspec

    spec = msgspec.json.decode(job["specs"][rank].encode(), type=RunnerSpec)
    group = join_group(spec, CASE_TIMEOUT_S, lambda what, s: _deadline(s))
    out = Path(job["out"])
    for raw in job["cases"]:
        case = Case(**raw)
        if rank == 0:
            _append(out, {"start": case.key})
        with _deadline(CASE_TIMEOUT_S):
            result = _run_case(case, rank, group)
        if rank == 0 or result.error:
            _append(
                out, {"case": case.key, "rank": rank, "text": result.text, "error": result.error}
            )


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Ends the process when the block takes longer than `seconds` (a collective never
    returning holds the GIL, so no Python-level timeout could)."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _append(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")


def run_sweep(cases: Sequence[Case], timeout_s: float) -> dict[str, CaseResult]:
    """Run every case on a 2-rank ring; results by "model_type/sharding". When the pair dies
    or hangs in a case, that case gets an error saying so and a new pair goes on with the
    cases after it, until `timeout_s` is spent (cases left then say they did not run)."""
    results: dict[str, CaseResult] = {}
    deadline = time.monotonic() + timeout_s
    left = list(cases)
    while left and time.monotonic() < deadline:
        results.update(_run_pair(left, deadline))
        done = [i for i, c in enumerate(left) if c.key in results]
        if not done:  # the pair never started a case (it could not form its ring)
            results[left[0].key] = CaseResult(error="the rank pair ended before this case")
        left = left[max(done, default=0) + 1 :]
    for c in left:
        results[c.key] = CaseResult(error="not run: out of time")
    return results


def _run_pair(cases: Sequence[Case], deadline: float) -> dict[str, CaseResult]:
    """One pair of rank processes over `cases`, in order, until they end or `deadline`."""
    import msgspec

    from exo_core.plugin.engine import group_env
    from exo_engine_mlx.distributed.testing import group_specs

    work = Path(tempfile.mkdtemp(prefix="family-sweep-"))
    specs = group_specs(Path(cases[0].path), sharding="pipeline", world=2)
    out = work / "results.jsonl"
    job = {
        "out": str(out),
        "cases": [vars(c) for c in cases],
        "specs": [msgspec.json.encode(s).decode() for s in specs],
    }
    job_path = work / "job.json"
    job_path.write_text(json.dumps(job))
    procs: list[subprocess.Popen[bytes]] = []
    for rank, spec in enumerate(specs):
        env = {**os.environ, **group_env(spec, work), RING_TOKEN_ENV: "family-sweep"}
        with (work / f"rank{rank}.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "exo_engine_mlx.family_sweep", str(job_path), str(rank)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return _results(out, work, [p.returncode for p in procs])


def _results(out: Path, work: Path, codes: Sequence[int | None]) -> dict[str, CaseResult]:
    """The finished cases, and the one the pair was in when it died or hung."""
    lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    results: dict[str, CaseResult] = {}
    started = None
    for line in lines:
        if "start" in line:
            started = line["start"]
            continue
        key = line["case"]
        previous = results.get(key)
        error = "; ".join(e for e in (previous.error if previous else "", line["error"]) if e)
        text = line["text"] if line["rank"] == 0 else (previous.text if previous else "")
        results[key] = CaseResult(text, error)
    if started is not None and started not in results:
        tail = "; ".join(
            f"rank {r} exit {c}: ...{(work / f'rank{r}.log').read_text()[-600:]}"
            for r, c in enumerate(codes)
            if c != 0
        )
        results[started] = CaseResult(error=f"the rank pair died or hung in this case ({tail})")
    return results


if __name__ == "__main__":
    rank_main(sys.argv[1], int(sys.argv[2]))
