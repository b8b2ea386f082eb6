"""The worker's side of an MLX runner: a `spawn`ed subprocess and the pipe to it."""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger

from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    Runner,
    RunnerDied,
    RunnerSpec,
    RunnerStatus,
    StatusReporter,
    Task,
    TaskId,
)
from exo_engine_mlx.distributed.group import group_env, ring_addresses
from exo_engine_mlx.protocol import (
    Cancel,
    ChunkOut,
    Launch,
    RunnerOptions,
    Shutdown,
    StatusUpdate,
    Submit,
    ToRunner,
    decode_from_runner,
    encode,
)
from exo_engine_mlx.runner_process import main as runner_main

_ENV_LOCK = threading.Lock()
STOP_GRACE_S = 5.0


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """The child of `spawn` inherits os.environ: set it only while the child starts."""
    with _ENV_LOCK:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


class MlxRunner(Runner):
    def __init__(self, spec: RunnerSpec, options: RunnerOptions, env: Mapping[str, str]) -> None:
        self.spec = spec
        self.options = options
        self.env = dict(env)
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._streams: dict[TaskId, MemoryObjectSendStream[Chunk]] = {}
        self._stopping = False
        self._status: RunnerStatus | None = None
        self._scratch: str | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _child_env(self) -> dict[str, str]:
        """The runner's environment; a rank of a group also gets its ring hostfile."""
        if self.spec.shard.world_size <= 1:
            return self.env
        self._scratch = tempfile.mkdtemp(prefix=f"exo-{self.spec.runner_id}-")
        return {**self.env, **group_env(self.spec, Path(self._scratch))}

    async def serve(self, report: StatusReporter) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        launch = encode(Launch(spec=self.spec, options=self.options))
        process = ctx.Process(
            target=runner_main,
            args=(child, launch),
            name=f"exo-runner-{self.spec.runner_id}",
            daemon=True,
        )
        with _environment(self._child_env()):
            process.start()
        child.close()
        self._conn, self._process = parent, process
        logger.info(f"runner {self.spec.runner_id} started (pid {process.pid})")
        try:
            await self._read(report)
        finally:
            self._fail_streams("the runner stopped")
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def _read(self, report: StatusReporter) -> None:
        assert self._conn is not None and self._process is not None
        conn = self._conn
        while True:
            try:
                raw = await anyio.to_thread.run_sync(conn.recv_bytes, abandon_on_cancel=True)
            except (EOFError, OSError):
                if self._stopping:
                    return
                await anyio.to_thread.run_sync(self._process.join, 2.0)
                raise RunnerDied(self._exit_reason(self._process.exitcode)) from None
            match decode_from_runner(raw):
                case StatusUpdate(status=status, error=error):
                    self._status = status
                    report(status, error)
                    if status == RunnerStatus.FAILED:
                        self._fail_streams(f"the runner failed: {error}")
                        raise RunnerDied(error or "the runner failed")
                case ChunkOut(chunk=chunk):
                    self._route(chunk)

    def _exit_reason(self, code: int | None) -> str:
        if self._status == RunnerStatus.CONNECTING:
            # The runner's own timer ended it while it waited for its peers.
            peers = ", ".join(ring_addresses(self.spec.instance))
            return (
                f"the runner group did not form within {self.options.group_connect_timeout_s:g} s: "
                f"rank {self.spec.shard.rank} could not connect to its peers ({peers}); "
                "a peer is unreachable, not started, or its port is taken"
            )
        return f"runner process exited unexpectedly (exit code {code})"

    def _route(self, chunk: Chunk) -> None:
        stream = self._streams.get(chunk.task_id)
        if stream is None:
            return
        try:
            stream.send_nowait(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._streams.pop(chunk.task_id, None)
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
            raise RunnerDied("the runner is not running")
        try:
            self._conn.send_bytes(encode(message))
        except (OSError, ValueError) as e:
            raise RunnerDied(f"the runner is gone: {e}") from e

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        send, receive = anyio.create_memory_object_stream[Chunk](math.inf)
        self._streams[task.task_id] = send
        self._send(Submit(task_id=task.task_id, params=task.params))
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
        await self._end_process()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    async def _end_process(self) -> None:
        """Wait for a clean exit, then terminate, then kill: the runner never outlives us."""
        process = self._process
        if process is None:
            return
        await anyio.to_thread.run_sync(process.join, STOP_GRACE_S)
        if process.is_alive():
            logger.warning(f"runner {self.spec.runner_id} did not stop; terminating it")
            process.terminate()
            await anyio.to_thread.run_sync(process.join, 2.0)
        if process.is_alive():
            process.kill()
            await anyio.to_thread.run_sync(process.join, 2.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._process = None
