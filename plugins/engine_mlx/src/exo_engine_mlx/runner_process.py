"""The runner subprocess: loads one model (or its shard), then batches generations until told
to stop.

It reads requests on a thread (so a busy generation loop never leaves the pipe full) and
answers on the main thread. When the parent goes away, the pipe closes and the runner exits.

A runner of a multi-rank instance first joins its group (CONNECTING), loads only its part of
the model (LOADING), warms up in step with the other ranks (WARMING_UP), then serves through
`distributed.coordinator.GroupLoop`, where rank 0 decides each step's batch.
"""

from __future__ import annotations

import queue
from multiprocessing.connection import Connection
from typing import Any

from loguru import logger

from exo_core.plugin import (
    Capability,
    ChatMessage,
    ErrorChunk,
    GenerationParams,
    RunnerStatus,
    SamplingParams,
    TaskId,
    public_message,
)
from exo_core.plugin.engine import (
    RunnerCancel,
    RunnerOutbox,
    RunnerShutdown,
    RunnerSpec,
    RunnerSubmit,
    ToRunner,
    Watchdog,
    report_load_failure,
    run_runner_child,
    start_rank_reader,
)
from exo_engine_mlx.protocol import Launch, RunnerOptions, decode_launch


def _warm_up(engine: Any) -> None:
    """One short greedy generation, so the first real request pays no first-call costs.

    Deterministic, so the ranks of a group run it in step without a plan."""
    params = GenerationParams(
        messages=(ChatMessage(role="user", content="Hi"),),
        max_tokens=2,
        sampling=SamplingParams(temperature=0),
    )
    engine.submit(TaskId("warmup"), params)
    while engine.active:
        engine.step()


def _prefix_budget(spec: RunnerSpec, options: RunnerOptions) -> int:
    """This rank's prefix cache budget. Ranks of a group must evict alike: their entries'
    sizes are proportional to their share of the KV cache, so the budgets are too."""
    shard = spec.shard
    if shard.world_size <= 1:
        return options.prefix_cache_bytes
    if spec.instance.sharding == "tensor":
        return options.prefix_cache_bytes // shard.world_size
    n_layers = max(spec.card.n_layers, 1)
    return options.prefix_cache_bytes // n_layers * (shard.end_layer - shard.start_layer)


def _load(launch: Launch, out: RunnerOutbox, watchdog: Watchdog) -> tuple[Any, Any]:
    """Join the group when there is one, then load this runner's part of the model."""
    from exo_engine_mlx.loading import ShardPlan, load_model

    spec, options = launch.spec, launch.options
    if spec.shard.world_size <= 1:
        out.status(RunnerStatus.LOADING)
        return load_model(spec.model_path, trust_remote_code=spec.card.trust_remote_code), None
    from exo_core.plugin.engine import barrier, join_group, ring_peers_lost

    out.status(RunnerStatus.CONNECTING)
    guard = watchdog.guard
    group = join_group(spec, options.group_connect_timeout_s, guard)
    watchdog.watch(
        ring_peers_lost(spec)
    )  # a dead peer ends a wait in a second, not at its deadline
    out.status(RunnerStatus.LOADING)
    plan = ShardPlan(
        sharding=spec.instance.sharding,
        group=group,
        start_layer=spec.shard.start_layer,
        end_layer=spec.shard.end_layer,
        layer_counts=tuple(
            s.end_layer - s.start_layer for s in sorted(spec.instance.shards, key=lambda s: s.rank)
        ),
    )
    loaded = load_model(spec.model_path, plan, trust_remote_code=spec.card.trust_remote_code)
    with guard("waiting for the other ranks to load the model", options.group_load_timeout_s):
        barrier(group)
    return loaded, group


def serve(conn: Connection, launch: Launch) -> int:
    from exo_core.plugin.engine import any_rank
    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.generation_solo import can_batch, has_recurrent_state
    from exo_engine_mlx.prefix_cache import PrefixCache

    out = RunnerOutbox(conn)
    spec, options = launch.spec, launch.options
    in_group = spec.shard.world_size > 1
    watchdog = Watchdog(lambda message: out.status(RunnerStatus.FAILED, f"runner group: {message}"))
    inbox: queue.Queue[ToRunner] = queue.Queue()
    start_rank_reader(conn, inbox.put, in_group, spec.shard.rank)
    try:
        (model, tokenizer), group = _load(launch, out, watchdog)
    except Exception as e:
        report_load_failure(out, e)
        return 1
    vision = None
    if Capability.VISION in spec.card.capabilities:
        from exo_engine_mlx.vision.inputs import VisionUnsupported, attach_vision

        try:
            vision = attach_vision(model, spec.model_path)
        except VisionUnsupported as e:
            logger.warning(f"serving text only: {e}")  # a request with images gets words
        except Exception as e:
            report_load_failure(out, e)
            return 1
    budget = _prefix_budget(spec, options)
    # The ranks of a group must step alike: each asks its own part, the group takes the
    # answer any rank needs (a pipeline rank's slice may hold no recurrent or unbatchable cache).
    recurrent, unbatchable = has_recurrent_state(model), not can_batch(model)
    one_at_a_time = options.max_concurrent == 1  # `exo --no-batch` on this rank's node
    if group is not None:
        with watchdog.guard("agreeing on how to generate", options.group_step_timeout_s):
            recurrent = any_rank(group, recurrent)
            unbatchable = any_rank(group, unbatchable)
            one_at_a_time = any_rank(group, one_at_a_time)
    engine = BatchEngine(
        model,
        tokenizer,
        max_concurrent=1 if one_at_a_time else options.max_concurrent,
        prefix_cache=PrefixCache(budget, options.min_prefix_tokens),
        default_max_tokens=options.default_max_tokens,
        context_length=spec.card.context_length,
        prefill_step_size=options.prefill_step_size,
        recurrent=recurrent,
        batched=not unbatchable,
        vision=vision,
        early_first_token=group is None,
    )
    loop = None
    try:
        if options.warmup:
            out.status(RunnerStatus.WARMING_UP)
            with watchdog.guard("warming up the runner group", options.group_step_timeout_s):
                _warm_up(engine)
            if engine.prefix_cache is not None:
                engine.prefix_cache = PrefixCache(budget, options.min_prefix_tokens)
        out.status(RunnerStatus.READY)
        if group is None:
            return _serve_alone(engine, inbox, out)
        from exo_engine_mlx.distributed.coordinator import GroupLoop

        loop = GroupLoop(
            engine=engine,
            group=group,
            inbox=inbox,
            send_chunk=out.chunk,
            watchdog=watchdog,
            step_timeout_s=options.group_step_timeout_s,
            heartbeat_s=options.group_heartbeat_s,
        )
        return loop.run()
    except Exception as e:
        # The trace goes to the log; clients and the replicated state get words only.
        logger.opt(exception=e).error("the runner failed")
        message = f"runner error: {public_message(e)}"
        waiting = loop.waiting_tasks() if loop is not None else engine.task_ids()
        for task_id in waiting:
            out.chunk(ErrorChunk(task_id=task_id, message=message))
        out.status(RunnerStatus.FAILED, message)
        return 1


IDLE_TRIM_AFTER_S = 0.5


def _serve_alone(engine: Any, inbox: queue.Queue[ToRunner], out: RunnerOutbox) -> int:
    from exo_engine_mlx.idle_memory import give_back_freed_memory

    trimmed = True
    while True:
        # Idle: block for the next request. One that comes at once (a client's next turn) is
        # not kept waiting for the memory the last one freed to be given back (up to tens of
        # ms on a loaded machine): that waits for a pause of IDLE_TRIM_AFTER_S. Busy: take
        # what has arrived, then step.
        messages: list[ToRunner] = []
        if not engine.active:
            try:
                messages.append(inbox.get(timeout=None if trimmed else IDLE_TRIM_AFTER_S))
            except queue.Empty:
                give_back_freed_memory()
                trimmed = True
                continue
        trimmed = False
        while True:
            try:
                messages.append(inbox.get_nowait())
            except queue.Empty:
                break
        for message in messages:
            match message:
                case RunnerSubmit(task_id=task_id, params=params):
                    for chunk in engine.submit(task_id, params):
                        out.chunk(chunk)
                case RunnerCancel(task_id=task_id):
                    for chunk in engine.cancel(task_id):
                        out.chunk(chunk)
                case RunnerShutdown():
                    return 0
        for chunk in engine.step():
            out.chunk(chunk)


def main(conn: Connection, launch_bytes: bytes) -> None:
    """The subprocess entry point (started with the `spawn` method)."""
    run_runner_child(conn, lambda: serve(conn, decode_launch(launch_bytes)))
