"""Runner groups on 127.0.0.1, without a cluster: every rank a real runner subprocess.

Greedy output of a group equals the single process token for token; a group that cannot form
fails within its deadline; a rank that dies ends the callers' streams with an error.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    RunnerStatus,
    SamplingParams,
    Task,
    TaskId,
    TextChunk,
    TokenLogprob,
)
from exo_core.plugin.engine import RING_TOKEN_ENV
from exo_engine_mlx.distributed.testing import (
    RunnerGroup,
    final,
    free_ports,
    group_specs,
    running_group,
    task,
    text_of,
)
from exo_engine_mlx.protocol import RunnerOptions
from exo_engine_mlx.tiny_model import make_tiny_model

PROMPTS = {
    "a": "hello world",
    "b": "the quick brown fox jumps over the lazy dog",
    "c": "numbers like 12345",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 4 heads and 2 KV heads: tensor parallel over 2 ranks splits both.
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", layers=4, heads=4, kv_heads=2)


def _texts(group: RunnerGroup, max_tokens: int = 24) -> dict[str, str]:
    tasks = [task(k, v, max_tokens=max_tokens) for k, v in PROMPTS.items()]
    # Rank 1's worker hands over "b" late, as a slower node would: rank 0 decides anyway.
    results = group.generate_many(tasks, delays={(1, "b"): 0.5, (0, "c"): 0.2})
    out = {}
    for task_id, by_rank in results.items():
        assert isinstance(final(by_rank[0]), FinishChunk)
        for rank, chunks in by_rank.items():
            if rank:  # followers answer only with the final chunk
                assert [type(c) for c in chunks] == [FinishChunk], chunks
        out[task_id] = text_of(by_rank[0])
    return out


@pytest.fixture(scope="module")
def single_texts(model_dir: Path) -> dict[str, str]:
    with running_group(group_specs(model_dir, sharding="pipeline", world=1)) as group:
        return _texts(group)


@pytest.fixture(scope="module")
def pipeline2(model_dir: Path) -> Iterator[RunnerGroup]:
    with running_group(group_specs(model_dir, sharding="pipeline", world=2)) as group:
        yield group


def test_group_steps_through_connecting_loading_warming_ready(pipeline2: RunnerGroup) -> None:
    for rank in (0, 1):
        assert [s for s, _ in pipeline2.statuses[rank]] == [
            RunnerStatus.CONNECTING,
            RunnerStatus.LOADING,
            RunnerStatus.WARMING_UP,
            RunnerStatus.READY,
        ]


def test_two_rank_pipeline_equals_single_process(
    pipeline2: RunnerGroup, single_texts: dict[str, str]
) -> None:
    assert _texts(pipeline2) == single_texts
    assert all(single_texts.values())


def test_two_rank_tensor_equals_single_process(
    model_dir: Path, single_texts: dict[str, str]
) -> None:
    with running_group(group_specs(model_dir, sharding="tensor", world=2)) as group:
        assert _texts(group) == single_texts


def test_cancel_on_rank_0_ends_the_task_on_every_rank(pipeline2: RunnerGroup) -> None:
    long = task("long", max_tokens=100_000)

    async def run() -> dict[int, list[Chunk]]:
        results: dict[int, list[Chunk]] = {}
        started = anyio.Event()

        async def one(rank: int) -> None:
            chunks: list[Chunk] = []
            results[rank] = chunks
            async for chunk in pipeline2.runners[rank].generate(long):
                chunks.append(chunk)
                if sum(isinstance(c, TextChunk) for c in chunks) >= 3:
                    started.set()

        async with anyio.create_task_group() as tg:
            for rank in pipeline2.runners:
                tg.start_soon(one, rank)
            with anyio.fail_after(60):
                await started.wait()
            # Every rank's worker cancels; rank 0's cancel is the one the group applies.
            for runner in pipeline2.runners.values():
                await runner.cancel(long.task_id)
        return results

    results = pipeline2.portal.call(run)
    for rank in (0, 1):
        last = final(results[rank])
        assert isinstance(last, FinishChunk) and last.finish_reason == FinishReason.CANCELLED
    # The group still serves after the cancel.
    assert isinstance(final(pipeline2.generate(task("after"))[0]), FinishChunk)


def test_random_sampling_without_seed_keeps_ranks_in_step(pipeline2: RunnerGroup) -> None:
    # Rank 0 gives the task a seed, so every rank draws the same tokens; divergence would end
    # the group with an error instead of a FinishChunk.
    tasks = [task(f"r{i}", max_tokens=12, temperature=1.0) for i in range(3)]
    for by_rank in pipeline2.generate_many(tasks).values():
        assert isinstance(final(by_rank[0]), FinishChunk)
        assert isinstance(final(by_rank[1]), FinishChunk)


def test_presence_and_frequency_penalties_keep_ranks_in_step(
    model_dir: Path, pipeline2: RunnerGroup
) -> None:
    # Negative: this tiny model repeats nothing by itself, so the answer changes only when
    # the penalties favour repeats.
    penalised = SamplingParams(temperature=0, presence_penalty=-2.0, frequency_penalty=-1.0)
    t = task("penalised", PROMPTS["b"], max_tokens=24, sampling=penalised)
    with running_group(group_specs(model_dir, sharding="pipeline", world=1)) as single:
        alone = text_of(single.generate(t)[0])
    by_rank = pipeline2.generate(t)
    assert isinstance(final(by_rank[1]), FinishChunk)
    assert text_of(by_rank[0]) == alone
    assert alone != text_of(pipeline2.generate(task("plain", PROMPTS["b"], max_tokens=24))[0])


@pytest.mark.slow
def test_no_batch_on_one_ranks_node_serves_the_group_one_at_a_time(
    model_dir: Path, single_texts: dict[str, str]
) -> None:
    # The ranks agree to decode one request at a time (else they would step different
    # batches and the group would fail), and the answers stay those of one process.
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    with running_group(specs, rank_options={1: RunnerOptions(max_concurrent=1)}) as group:
        assert _texts(group) == single_texts


def test_a_follower_whose_worker_submits_late_gets_the_final_at_once(
    pipeline2: RunnerGroup,
) -> None:
    t = task("late", max_tokens=4)
    done = pipeline2.generate_many([t], delays={(1, "late"): 3.0})[t.task_id]
    assert isinstance(final(done[0]), FinishChunk)
    assert isinstance(final(done[1]), FinishChunk)


def test_a_group_with_an_unreachable_peer_fails_within_its_deadline(model_dir: Path) -> None:
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    options = RunnerOptions(group_connect_timeout_s=3.0)
    with RunnerGroup(specs, options=options, ranks=[0]) as group:
        # The deadline runs from the connect phase (starting the process and importing MLX
        # can take long on a loaded machine).
        group.wait(
            lambda: group.status(0) == RunnerStatus.CONNECTING or 0 in group.died,
            60.0,
            "rank 0 did not start connecting",
        )
        connecting = time.monotonic()
        group.wait(lambda: 0 in group.died, 30.0, "rank 0 did not give up")
        elapsed = time.monotonic() - connecting
    message = str(group.died[0])
    assert "did not form within 3 s" in message and "could not connect" in message, message
    assert group.statuses[0][-1][0] == RunnerStatus.CONNECTING
    assert elapsed < 13, elapsed  # a 3 s deadline, with room for a loaded machine


def test_a_taken_ring_port_fails_at_once_with_the_address(model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        specs = group_specs(model_dir, sharding="pipeline", world=2, ports=[port, *free_ports(1)])
        with RunnerGroup(specs, ranks=[0]) as group:
            group.wait(lambda: 0 in group.died, 30.0, "rank 0 did not fail")
    message = str(group.died[0])
    assert f"127.0.0.1:{port}" in message and "cannot listen" in message, message


def test_a_rank_without_the_group_token_is_refused_before_any_step(model_dir: Path) -> None:
    # Rank 1 stands for a stranger that took a peer's place in the ring: it connects like a
    # rank, but holds another token (another cluster key).
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    tokens = {0: {RING_TOKEN_ENV: "the group's token"}, 1: {RING_TOKEN_ENV: "a guess"}}
    options = RunnerOptions(group_connect_timeout_s=20.0)
    with RunnerGroup(specs, options=options, rank_env=tokens) as group:
        group.wait(lambda: len(group.died) == 2, 120.0, "the ranks did not refuse each other")
    # The first rank to refuse ends its process; the other may see its socket close first.
    messages = [str(group.died[rank]) for rank in (0, 1)]
    assert any("cannot prove it belongs to the group" in m for m in messages), messages
    for rank in (0, 1):
        assert RunnerStatus.LOADING not in [s for s, _ in group.statuses[rank]]


def test_killing_a_rank_mid_generation_ends_the_callers_stream_within_seconds(
    model_dir: Path,
) -> None:
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    with running_group(specs) as group:
        killed_at: list[float] = []

        def on_chunk(rank: int, chunk: Chunk) -> None:
            if rank == 0 and isinstance(chunk, TextChunk) and not killed_at:
                group.kill(1)
                killed_at.append(time.monotonic())

        results = group.generate(task("doomed", max_tokens=100_000), on_chunk=on_chunk)
        ended = time.monotonic()
        group.wait(lambda: 0 in group.died, 10.0, "rank 0 did not fail")
    last = final(results[0])
    assert isinstance(last, ErrorChunk), last
    assert ended - killed_at[0] < 5.0
    assert "peer" in last.message or "lost" in last.message, last.message


@pytest.mark.slow
def test_a_frozen_rank_fails_the_group_after_the_step_timeout(model_dir: Path) -> None:
    # A stopped process keeps its sockets open: only the watchdog can notice it.
    specs = group_specs(model_dir, sharding="pipeline", world=2)
    options = RunnerOptions(group_step_timeout_s=2.0)
    with running_group(specs, options=options) as group:
        frozen_at: list[float] = []

        def on_chunk(rank: int, chunk: Chunk) -> None:
            if rank == 0 and isinstance(chunk, TextChunk) and not frozen_at:
                pid = group.runners[1].pid
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                frozen_at.append(time.monotonic())

        try:
            # Only rank 0's caller: the frozen rank's worker would wait for its runner forever.
            results = group.generate(
                task("stuck", max_tokens=100_000), on_chunk=on_chunk, ranks=[0]
            )
            ended = time.monotonic()
        finally:
            group.kill(1)
    last = final(results[0])
    assert isinstance(last, ErrorChunk), last
    assert "did not complete within 2 s" in last.message, last.message
    assert ended - frozen_at[0] < 6.0


def test_the_prefix_cache_hits_alike_on_every_rank(pipeline2: RunnerGroup) -> None:
    # The ranks' budgets are scaled to their share of the KV cache, so they store, hit and
    # evict alike; a rank that reused a different prefix would fail the fingerprint check.
    prompt = "the quick brown fox jumps over the lazy dog, then the dog sleeps"
    first = pipeline2.generate(task("p1", prompt, max_tokens=6))
    again = pipeline2.generate(task("p2", prompt, max_tokens=6))
    for by_rank in (first, again):
        assert all(isinstance(final(chunks), FinishChunk) for chunks in by_rank.values())
    done = final(again[0])
    assert isinstance(done, FinishChunk) and done.usage.cached_tokens > 0
    assert text_of(again[0]) == text_of(first[0])


def _asking(t: Task, **params: Any) -> Task:
    return msgspec.structs.replace(t, params=msgspec.structs.replace(t.params, **params))


def _answer(chunks: list[Chunk]) -> tuple[str, list[TokenLogprob], str, int]:
    done = final(chunks)
    assert isinstance(done, FinishChunk), done
    logprobs = [lp for c in chunks if isinstance(c, TextChunk) for lp in c.logprobs]
    return text_of(chunks), logprobs, str(done.finish_reason), done.usage.completion_tokens


def test_sampling_logprobs_and_stops_of_a_batch_answer_as_one_rank(
    model_dir: Path, pipeline2: RunnerGroup
) -> None:
    # Rank 0 has no logits of its own: it streams the tokens and logprobs the last rank
    # shares (distributed/sampled.py). One batch mixes seeded sampling with penalties,
    # logprobs with alternatives, a stop string and plain greedy.
    with running_group(group_specs(model_dir, sharding="pipeline", world=1)) as single:
        plain = text_of(single.generate(task("probe", PROMPTS["a"], max_tokens=24))[0])
        stop = plain[len(plain) // 2 :][:3]
        assert stop.strip()
        seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=11, presence_penalty=0.4)
        tasks = [
            _asking(task("sampled", PROMPTS["b"], max_tokens=16, sampling=seeded), logprobs=True),
            _asking(task("top", PROMPTS["c"], max_tokens=16), logprobs=True, top_logprobs=3),
            _asking(task("stop", PROMPTS["a"], max_tokens=24), stop=(stop,)),
            task("plain", PROMPTS["b"], max_tokens=16),
        ]
        alone = {k: _answer(v[0]) for k, v in single.generate_many(tasks).items()}
    together = pipeline2.generate_many(tasks)
    assert alone[TaskId("stop")][2] == str(FinishReason.STOP)
    for task_id, by_rank in together.items():
        assert isinstance(final(by_rank[1]), FinishChunk)
        text, logprobs, reason, count = _answer(by_rank[0])
        want_text, want_logprobs, want_reason, want_count = alone[task_id]
        assert (text, reason, count) == (want_text, want_reason, want_count), task_id
        assert [lp.token for lp in logprobs] == [lp.token for lp in want_logprobs]
        assert [lp.logprob for lp in logprobs] == pytest.approx(
            [lp.logprob for lp in want_logprobs], abs=1e-4
        )
        for got, want in zip(logprobs, want_logprobs, strict=True):
            assert [t.token for t in got.top] == [t.token for t in want.top], task_id
            assert [t.logprob for t in got.top] == pytest.approx(
                [t.logprob for t in want.top], abs=1e-4
            )
    assert all(len(lp.top) == 3 for lp in _answer(together[TaskId("top")][0])[1])
