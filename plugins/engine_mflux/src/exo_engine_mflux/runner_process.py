"""The image runner subprocess: loads one image model, then generates one request at a time.

Requests arrive on a reader thread, which also marks cancellations at once: the generation on
the main thread checks the mark after every denoising step, so a cancel stops it at the next
step. When the parent goes away, the pipe closes and the runner exits.
"""

from __future__ import annotations

import queue
import random
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from loguru import logger

from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    ImageChunk,
    ProgressChunk,
    RunnerStatus,
    TaskId,
    Usage,
    public_message,
)
from exo_core.plugin.engine import (
    RunnerCancel,
    RunnerOutbox,
    RunnerShutdown,
    RunnerSubmit,
    ToRunner,
    Watchdog,
    barrier,
    join_group,
    report_load_failure,
    ring_peers_lost,
    run_runner_child,
    start_rank_reader,
)
from exo_core.plugin.images import ImageRequest
from exo_engine_mflux.families import pipeline_family
from exo_engine_mflux.protocol import Launch, decode_launch

# How long the ranks of a group wait for each other to load the model.
LOAD_TIMEOUT_S = 600.0


class Inbox:
    """Requests in arrival order, and the set of cancelled task ids (read between steps)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[RunnerSubmit | RunnerShutdown] = queue.Queue()
        self.cancelled: set[TaskId] = set()
        self.stopping = threading.Event()

    def put(self, message: ToRunner) -> None:
        match message:
            case RunnerCancel(task_id=task_id):
                self.cancelled.add(task_id)
            case RunnerShutdown():
                self.stopping.set()
                self.queue.put(message)
            case RunnerSubmit():
                self.queue.put(message)

    def should_stop(self, task_id: TaskId) -> bool:
        return self.stopping.is_set() or task_id in self.cancelled


def run_request(
    loaded: object,
    task_id: TaskId,
    request: ImageRequest,
    inbox: Inbox,
    emit: Callable[[Chunk], None],
    should_stop: Callable[[TaskId], bool] | None = None,
    leader: bool = True,
) -> None:
    """Generate every image of one request, streaming progress and images; end the stream.

    `should_stop` is asked after every step (and before each image is sent): in a group it is
    a vote of all ranks, so they stop at the same step. Only a `leader` decodes partial
    images (the other ranks of a group send their workers the final chunk alone)."""
    from exo_engine_mflux import pipeline

    stop = should_stop or inbox.should_stop
    assert isinstance(loaded, pipeline.LoadedModel)
    steps = request.steps or loaded.default_steps
    guidance = loaded.default_guidance if request.guidance is None else request.guidance
    seed = request.seed if request.seed is not None else random.randrange(2**31)
    try:
        for index in range(request.n):
            image_seed = seed + index
            sent_partials = 0

            def on_step(step: pipeline.Step, index: int = index, seed: int = image_seed) -> None:
                nonlocal sent_partials
                if stop(task_id):
                    raise pipeline.Cancelled(f"after step {step.done - 1} of {step.total}")
                emit(ProgressChunk(task_id=task_id, step=step.done, total=step.total, index=index))
                partials = pipeline.partial_steps(step.total, request.partial_images)
                if leader and step.done in partials:
                    image = pipeline.decode_latents(
                        loaded, step.latents, request.width, request.height
                    )
                    data = pipeline.encode_image(image, request.output_format, request.quality)
                    emit(
                        ImageChunk(
                            task_id=task_id,
                            index=index,
                            data=data,
                            format=request.output_format,
                            width=image.width,
                            height=image.height,
                            partial=True,
                            partial_index=sent_partials,
                            seed=seed,
                        )
                    )
                    sent_partials += 1

            image = pipeline.generate(
                loaded,
                prompt=request.prompt,
                seed=image_seed,
                width=request.width,
                height=request.height,
                steps=steps,
                guidance=guidance,
                negative_prompt=request.negative_prompt,
                input_image=request.input_image,
                on_step=on_step,
            )
            if stop(task_id):
                raise pipeline.Cancelled
            emit(
                ImageChunk(
                    task_id=task_id,
                    index=index,
                    data=pipeline.encode_image(image, request.output_format, request.quality),
                    format=request.output_format,
                    width=image.width,
                    height=image.height,
                    seed=image_seed,
                )
            )
        emit(FinishChunk(task_id=task_id, finish_reason=FinishReason.STOP, usage=Usage()))
    except pipeline.Cancelled as e:
        # In the node's log: how far a cancelled generation got.
        print(f"image task {task_id} cancelled {e}".rstrip(), file=sys.stderr, flush=True)
        emit(FinishChunk(task_id=task_id, finish_reason=FinishReason.CANCELLED))
    except Exception as e:
        # One bad request (an undecodable upload, say) fails alone; the runner keeps serving.
        # (In a group every rank decodes the same upload, so all of them fail it alike.)
        emit(ErrorChunk(task_id=task_id, message=f"image generation failed: {e}"))
    finally:
        inbox.cancelled.discard(task_id)


def _warm_up(loaded: object) -> None:
    from PIL import Image

    from exo_engine_mflux import pipeline

    assert isinstance(loaded, pipeline.LoadedModel)
    # An edit model edits an image: a blank one (Qwen-Image-Edit refuses to run without).
    blank = Image.new("RGB", (64, 64), (128, 128, 128))
    pipeline.generate(
        loaded,
        prompt="warm up",
        seed=0,
        width=64,
        height=64,
        steps=1,
        guidance=loaded.default_guidance,
        negative_prompt=None,
        input_image=pipeline.encode_image(blank, "png", 100) if loaded.edits else None,
        on_step=lambda step: None,
    )


def _load(launch: Launch, out: RunnerOutbox, watchdog: Watchdog) -> tuple[object, Any]:
    """Join the group when there is one, then load the model (a rank keeps its blocks only)."""
    from pathlib import Path

    from exo_engine_mflux import pipeline

    spec = launch.spec
    group = None
    if spec.shard.world_size > 1:
        out.status(RunnerStatus.CONNECTING)
        group = join_group(spec, launch.connect_timeout_s, watchdog.guard)
        watchdog.watch(ring_peers_lost(spec))  # a dead peer ends a wait at once
    out.status(RunnerStatus.LOADING)
    loaded = pipeline.load(pipeline_family(spec.card), Path(spec.model_path))
    if group is not None:
        from exo_engine_mflux.split import split_transformer

        shard = spec.shard
        split_transformer(loaded.model, group, shard.start_layer, shard.end_layer)
        logger.info(
            f"rank {shard.rank} of {shard.world_size} holds transformer blocks "
            f"[{shard.start_layer}, {shard.end_layer})"
        )
        with watchdog.guard("waiting for the other ranks to load the model", LOAD_TIMEOUT_S):
            barrier(group)
    return loaded, group


def serve(conn: Connection, launch: Launch) -> int:
    out = RunnerOutbox(conn)
    inbox = Inbox()
    in_group = launch.spec.shard.world_size > 1
    start_rank_reader(conn, inbox.put, in_group, launch.spec.shard.rank)
    watchdog = Watchdog(lambda message: out.status(RunnerStatus.FAILED, f"runner group: {message}"))
    try:
        loaded, group = _load(launch, out, watchdog)
        if launch.warmup:
            out.status(RunnerStatus.WARMING_UP)
            # Deterministic, so the ranks of a group run it in step without a plan.
            with watchdog.guard("warming up the runner group", launch.step_timeout_s):
                _warm_up(loaded)
    except Exception as e:
        report_load_failure(out, e)
        return 1
    out.status(RunnerStatus.READY)
    if group is not None:
        from exo_engine_mflux.group import ImageGroupLoop

        loop = ImageGroupLoop(
            loaded=loaded,
            group=group,
            inbox=inbox,
            out=out,
            watchdog=watchdog,
            step_timeout_s=launch.step_timeout_s,
        )
        try:
            return loop.run()
        except Exception as e:
            logger.opt(exception=e).error("the runner group failed")
            out.status(RunnerStatus.FAILED, f"runner group: {public_message(e)}")
            return 1
    return _serve_alone(loaded, inbox, out)


def _serve_alone(loaded: object, inbox: Inbox, out: RunnerOutbox) -> int:
    while True:
        message = inbox.queue.get()
        if isinstance(message, RunnerShutdown):
            return 0
        if message.task_id in inbox.cancelled:  # cancelled while it waited its turn
            inbox.cancelled.discard(message.task_id)
            out.chunk(FinishChunk(task_id=message.task_id, finish_reason=FinishReason.CANCELLED))
            continue
        if message.image is None:  # `ImageRunner.generate` refuses text tasks before this
            out.chunk(ErrorChunk(task_id=message.task_id, message="not an image request"))
            continue
        run_request(loaded, message.task_id, message.image, inbox, out.chunk)
        if inbox.stopping.is_set():
            return 0


def main(conn: Connection, launch_bytes: bytes) -> None:
    """The subprocess entry point (started with the `spawn` method)."""
    run_runner_child(conn, lambda: serve(conn, decode_launch(launch_bytes)))
