"""The worker's side of an image runner: a `spawn`ed subprocess and the pipe to it."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger

from exo_core.engine import Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_core.generation import Chunk, ErrorChunk, FinishChunk
from exo_core.ids import TaskId
from exo_core.state import RunnerStatus, Task
from exo_engine_mflux.protocol import (
    Cancel,
    ChunkOut,
    Launch,
    Shutdown,
    StatusUpdate,
    Submit,
    ToRunner,
    decode_from_runner,
    encode,
)
from exo_engine_mflux.runner_process import main as runner_main

STOP_GRACE_S = 5.0
_ENV_LOCK = threading.Lock()


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """A `spawn`ed child inherits os.environ: set it only while the child starts."""
    with _ENV_LOCK:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


class ImageRunner(Runner):
    def __init__(self, spec: RunnerSpec, env: Mapping[str, str], warmup: bool = True) -> None:
        self.spec = spec
        self.env = dict(env)
        self.warmup = warmup
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._streams: dict[TaskId, MemoryObjectSendStream[Chunk]] = {}
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def serve(self, report: StatusReporter) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=runner_main,
            args=(child, encode(Launch(spec=self.spec, warmup=self.warmup))),
            name=f"exo-image-runner-{self.spec.runner_id}",
            daemon=True,
        )
        with _environment(self.env):
            process.start()
        child.close()
        self._conn, self._process = parent, process
        logger.info(f"image runner {self.spec.runner_id} started (pid {process.pid})")
        try:
            await self._read(report)
        finally:
            self._fail_streams("the runner stopped")
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def _read(self, report: StatusReporter) -> None:
        assert self._conn is not None and self._process is not None
        conn, process = self._conn, self._process
        while True:
            try:
                raw = await anyio.to_thread.run_sync(conn.recv_bytes, abandon_on_cancel=True)
            except (EOFError, OSError):
                if self._stopping:
                    return
                await anyio.to_thread.run_sync(process.join, 2.0)
                raise RunnerDied(
                    f"image runner exited unexpectedly (exit code {process.exitcode})"
                ) from None
            match decode_from_runner(raw):
                case StatusUpdate(status=status, error=error):
                    report(status, error)
                    if status == RunnerStatus.FAILED:
                        raise RunnerDied(error or "the image runner failed")
                case ChunkOut(chunk=chunk):
                    self._route(chunk)

    def _route(self, chunk: Chunk) -> None:
        stream = self._streams.get(chunk.task_id)
        if stream is None:
            return
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            stream.send_nowait(chunk)
        if isinstance(chunk, FinishChunk | ErrorChunk):
            self._streams.pop(chunk.task_id, None)
            stream.close()

    def _fail_streams(self, message: str) -> None:
        for task_id, stream in list(self._streams.items()):
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                stream.send_nowait(ErrorChunk(task_id=task_id, message=message))
            stream.close()
        self._streams.clear()

    def _send(self, message: ToRunner) -> None:
        if self._conn is None:
            raise RunnerDied("the image runner is not running")
        try:
            self._conn.send_bytes(encode(message))
        except (OSError, ValueError) as e:
            raise RunnerDied(f"the image runner is gone: {e}") from e

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        if task.image is None:
            yield ErrorChunk(task_id=task.task_id, message="an image model cannot generate text")
            return
        send, receive = anyio.create_memory_object_stream[Chunk](math.inf)
        self._streams[task.task_id] = send
        self._send(Submit(task_id=task.task_id, request=task.image))
        async with receive:
            async for chunk in receive:
                yield chunk

    async def cancel(self, task_id: TaskId) -> None:
        if task_id in self._streams:
            self._send(Cancel(task_id=task_id))

    async def stop(self) -> None:
        self._stopping = True
        if self._conn is not None:
            with suppress(OSError, ValueError):
                self._conn.send_bytes(encode(Shutdown()))
        process = self._process
        if process is not None:
            # A generation stops at its next step; then terminate, then kill.
            await anyio.to_thread.run_sync(process.join, STOP_GRACE_S)
            if process.is_alive():
                process.terminate()
                await anyio.to_thread.run_sync(process.join, 2.0)
            if process.is_alive():
                process.kill()
                await anyio.to_thread.run_sync(process.join, 2.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._process = None
