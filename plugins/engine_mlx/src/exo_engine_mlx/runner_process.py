"""The runner subprocess: loads one model, then batches generations until told to stop.

It reads requests on a thread (so a busy generation loop never leaves the pipe full) and
answers on the main thread. When the parent goes away, the pipe closes and the runner exits.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from exo_core.generation import ChatMessage, ErrorChunk, GenerationParams, SamplingParams
from exo_core.ids import TaskId
from exo_core.state import RunnerStatus
from exo_engine_mlx.protocol import (
    Cancel,
    ChunkOut,
    FromRunner,
    Launch,
    RunnerOptions,
    Shutdown,
    StatusUpdate,
    Submit,
    ToRunner,
    decode_launch,
    decode_to_runner,
    encode,
)


def _reader(conn: Connection, inbox: queue.Queue[ToRunner]) -> None:
    try:
        while True:
            inbox.put(decode_to_runner(conn.recv_bytes()))
    except (EOFError, OSError):
        inbox.put(Shutdown())  # the parent is gone


def _warm_up(engine: object, options: RunnerOptions) -> None:
    """One short greedy generation, so the first real request pays no first-call costs."""
    from exo_engine_mlx.batching import BatchEngine

    assert isinstance(engine, BatchEngine)
    params = GenerationParams(
        messages=(ChatMessage(role="user", content="Hi"),),
        max_tokens=2,
        sampling=SamplingParams(temperature=0),
    )
    engine.submit(TaskId("warmup"), params)
    while engine.active:
        engine.step()


def serve(conn: Connection, launch: Launch) -> int:
    def send(message: FromRunner) -> None:
        conn.send_bytes(encode(message))

    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.prefix_cache import PrefixCache

    options = launch.options
    send(StatusUpdate(status=RunnerStatus.LOADING))
    try:
        model, tokenizer = load_model(launch.spec.model_path)
    except Exception as e:
        send(StatusUpdate(status=RunnerStatus.FAILED, error=f"loading failed: {e}"))
        return 1
    engine = BatchEngine(
        model,
        tokenizer,
        max_concurrent=options.max_concurrent,
        prefix_cache=PrefixCache(options.prefix_cache_bytes, options.min_prefix_tokens),
        default_max_tokens=options.default_max_tokens,
    )
    if options.warmup:
        send(StatusUpdate(status=RunnerStatus.WARMING_UP))
        _warm_up(engine, options)
        if engine.prefix_cache is not None:
            engine.prefix_cache = PrefixCache(options.prefix_cache_bytes, options.min_prefix_tokens)
    send(StatusUpdate(status=RunnerStatus.READY))

    inbox: queue.Queue[ToRunner] = queue.Queue()
    threading.Thread(target=_reader, args=(conn, inbox), daemon=True).start()
    tasks: set[TaskId] = set()
    try:
        while True:
            # Idle: block for the next request. Busy: take what has arrived, then step.
            messages = [inbox.get()] if not engine.active else []
            while True:
                try:
                    messages.append(inbox.get_nowait())
                except queue.Empty:
                    break
            for message in messages:
                match message:
                    case Submit(task_id=task_id, params=params):
                        tasks.add(task_id)
                        for chunk in engine.submit(task_id, params):
                            send(ChunkOut(chunk=chunk))
                    case Cancel(task_id=task_id):
                        for chunk in engine.cancel(task_id):
                            send(ChunkOut(chunk=chunk))
                    case Shutdown():
                        return 0
            for chunk in engine.step():
                send(ChunkOut(chunk=chunk))
    except Exception as e:
        detail = "".join(traceback.format_exception(e)[-3:])
        for task_id in engine.task_ids():
            send(ChunkOut(chunk=ErrorChunk(task_id=task_id, message=f"runner error: {e}")))
        send(StatusUpdate(status=RunnerStatus.FAILED, error=f"runner error: {e}\n{detail}"))
        return 1


def main(conn: Connection, launch_bytes: bytes) -> None:
    """The subprocess entry point (started with the `spawn` method)."""
    code = serve(conn, decode_launch(launch_bytes))
    conn.close()
    sys.exit(code)
