"""What a pipeline's ranks move per decode step: the hidden state between ranks and the last
rank's sampled tokens (plus the logprobs a request reads), handed on point to point, never
the whole logits.

Each rank of a 2-rank pipeline of the tiny model runs its own `BatchEngine` in this process,
with MLX's point-to-point and collective calls replaced by counters (a received hidden state is
zeros: what the tokens are does not matter here, only how many bytes each call carries). The
2-rank runs that check the tokens themselves are in test_distributed.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest

from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.distributed.pipeline import split_pipeline
from exo_engine_mlx.distributed.testing import RankOfTwo
from exo_engine_mlx.tiny_model import make_tiny_model

HIDDEN = 64
VOCAB = 400
SEQUENCES = 3


@pytest.fixture
def moved(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """Every send, receive and all_sum as (kind, bytes), in call order."""
    calls: list[tuple[str, int]] = []

    def send(x: mx.array, dst: int, group: Any = None) -> mx.array:
        calls.append(("send", x.nbytes))
        return x

    def recv_like(like: mx.array, src: int, group: Any = None) -> mx.array:
        calls.append(("recv", like.nbytes))
        return mx.zeros_like(like)

    def all_sum(x: mx.array, group: Any = None) -> mx.array:
        calls.append(("all_sum", x.nbytes))
        return x

    monkeypatch.setattr(mx.distributed, "send", send)
    monkeypatch.setattr(mx.distributed, "recv_like", recv_like)
    monkeypatch.setattr(mx.distributed, "all_sum", all_sum)
    yield calls


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", layers=4, hidden=HIDDEN, vocab_size=VOCAB
    )


def _engine(model_dir: Path, rank: int) -> BatchEngine:
    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    start, end = (0, 2) if rank == 0 else (2, 4)
    stage = split_pipeline(model, start, end, (2, 2), RankOfTwo(rank))  # type: ignore[arg-type]
    return BatchEngine(stage, tokenizer, max_concurrent=SEQUENCES)


def _request(**kw: Any) -> GenerationParams:
    return GenerationParams(
        messages=(ChatMessage(role="user", content="hello world"),),
        max_tokens=6,
        ignore_eos=True,
        **kw,
    )


TOKENS = 4 * SEQUENCES  # the largest token hand-on of a step: an id a sequence, float32


def _decode_steps(
    engine: BatchEngine, requests: dict[str, GenerationParams], calls: list[tuple[str, int]]
) -> list[list[tuple[str, int]]]:
    """Each decode step's transfers (prefill steps, which hand on no tokens, left out)."""
    for task_id, params in requests.items():
        assert engine.submit(TaskId(task_id), params) == []
    steps: list[list[tuple[str, int]]] = []
    while engine.active:
        calls.clear()
        engine.step()
        steps.append(list(calls))
    # A decode step ends by handing on the sampled tokens: a few bytes.
    return [s for s in steps if s and s[-1][1] <= TOKENS]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_decode_step_moves_the_hidden_state_and_4_bytes_a_sequence(
    rank: int, model_dir: Path, moved: list[tuple[str, int]]
) -> None:
    engine = _engine(model_dir, rank)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=3, presence_penalty=0.5)
    requests = {
        "greedy": _request(),
        "sampled": _request(sampling=seeded),
        "again": _request(sampling=SamplingParams(temperature=0)),
    }
    steps = _decode_steps(engine, requests, moved)
    assert steps
    # Rank 0 sends the hidden state on and receives the tokens; the last rank the reverse.
    hidden, tokens = ("send", "recv") if rank == 0 else ("recv", "send")
    for step in steps:
        # The hidden state of one token a sequence, then the sampled ids (float32 each):
        # never the logits, and no all_sum.
        assert [kind for kind, _ in step] == [hidden, tokens], step
        assert step[0][1] <= SEQUENCES * HIDDEN * 4 and step[1][1] <= TOKENS, step
    # Every token hand-on of the whole run together is smaller than one row of logits was.
    assert sum(s[1][1] for s in steps) < VOCAB * 4


def test_logprobs_add_only_the_token_and_its_alternatives(
    model_dir: Path, moved: list[tuple[str, int]]
) -> None:
    engine = _engine(model_dir, 1)
    top = 3
    for task_id, params in {"lp": _request(logprobs=True, top_logprobs=top)}.items():
        assert engine.submit(TaskId(task_id), params) == []
    sizes: set[int] = set()
    while engine.active:
        moved.clear()
        engine.step()
        sizes |= {size for kind, size in moved if kind == "send"}
    # The token's id, then (id, logprob) for it and each alternative: float32 each.
    assert sizes == {4 * (1 + 2 * (1 + top))}
