"""A runner whose model lives in a child process: what an engine needs to run one.

An engine's model is best kept out of the node's process (a crash or a stuck native call then
costs one runner, not the node). This module is the shared part of such a runner:

- the pipe protocol: msgpack frames; the worker sends `RunnerSubmit`, `RunnerCancel` and
  `RunnerShutdown`, the child answers `RunnerStatusUpdate` and `RunnerChunkOut`;
- `SubprocessRunner`, the worker's side: it `spawn`s the child with the engine's entry point
  and launch bytes, routes chunks to the tasks' streams, turns the child's death into
  `RunnerDied`, and stops it (ask, then terminate, then kill);
- the child's pieces: `RunnerOutbox` (thread-safe frames to the parent), `start_request_reader`
  (requests read on a thread, so a busy model loop never leaves the pipe full),
  `report_load_failure` and `run_runner_child` (the entry point's frame: logging, exit code).

The engine keeps what is its own: its launch settings, how it loads, and its serving loop.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import NoReturn

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger

from exo_core.engine import Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_core.generation import Chunk, ErrorChunk, FinishChunk, GenerationParams
from exo_core.ids import TaskId
from exo_core.images import ImageRequest
from exo_core.redact import public_message
from exo_core.state import RunnerStatus, Task

# -- the pipe protocol -------------------------------------------------------------------------


class RunnerSubmit(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Run one task: `image` is set for an image task (its `params` are then empty)."""

    task_id: TaskId
    params: GenerationParams
    image: ImageRequest | None = None


class RunnerCancel(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Frame to a runner subprocess: stop generating one task."""

    task_id: TaskId


class RunnerShutdown(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Frame to a runner subprocess: finish and exit."""

    pass


class RunnerStatusUpdate(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    status: RunnerStatus
    error: str | None = None


class RunnerChunkOut(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    chunk: Chunk


ToRunner = RunnerSubmit | RunnerCancel | RunnerShutdown
"""Any frame the node sends a runner subprocess."""
FromRunner = RunnerStatusUpdate | RunnerChunkOut

encode_frame = msgspec.msgpack.Encoder().encode
decode_to_runner = msgspec.msgpack.Decoder(ToRunner).decode
decode_from_runner = msgspec.msgpack.Decoder(FromRunner).decode

# -- the worker's side -------------------------------------------------------------------------

STOP_GRACE_S = 5.0
RunnerEntry = Callable[[Connection, bytes], None]
"""The child's entry point: a module-level function (`spawn` pickles it by name) given the
pipe and the engine's launch bytes."""

_ENV_LOCK = threading.Lock()


@contextmanager
def child_environment(env: Mapping[str, str]) -> Iterator[None]:
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


class SubprocessRunner(Runner):
    """The worker's side of a runner in a `spawn`ed child process.

    An engine passes its entry point and launch bytes, and may override `child_env` (extra
    environment for the child), `exit_reason` (why the child died, in words) and `stop`
    (to free its own resources after `super().stop()`)."""

    #: How log lines, errors and the process name call this runner (e.g. "image runner").
    kind = "runner"

    def __init__(
        self, spec: RunnerSpec, env: Mapping[str, str], *, entry: RunnerEntry, launch: bytes
    ) -> None:
        self.spec = spec
        self.env = dict(env)
        self._entry = entry
        self._launch = launch
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._streams: dict[TaskId, MemoryObjectSendStream[Chunk]] = {}
        self._stopping = False
        self.status: RunnerStatus | None = None
        """The last status the child reported."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def child_env(self) -> Mapping[str, str]:
        """The child's whole environment (called once, just before it starts)."""
        return self.env

    def exit_reason(self, exit_code: int | None) -> str:
        """Why the child ended without being asked to, for the task's caller and the state."""
        return f"{self.kind} process exited unexpectedly (exit code {exit_code})"

    async def serve(self, report: StatusReporter) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=self._entry,
            args=(child, self._launch),
            name=f"exo-{self.kind.replace(' ', '-')}-{self.spec.runner_id}",
            daemon=True,
        )
        with child_environment(self.child_env()):
            process.start()
        child.close()
        self._conn, self._process = parent, process
        logger.info(f"{self.kind} {self.spec.runner_id} started (pid {process.pid})")
        try:
            await self._read(report, parent, process)
        finally:
            self._fail_streams(f"the {self.kind} stopped")
            with anyio.CancelScope(shield=True):
                await self.stop()

    async def _read(self, report: StatusReporter, conn: Connection, process: BaseProcess) -> None:
        while True:
            try:
                raw = await anyio.to_thread.run_sync(conn.recv_bytes, abandon_on_cancel=True)
            except (EOFError, OSError):
                if self._stopping:
                    return
                await anyio.to_thread.run_sync(process.join, 2.0)
                raise RunnerDied(self.exit_reason(process.exitcode)) from None
            match decode_from_runner(raw):
                case RunnerStatusUpdate(status=status, error=error):
                    self.status = status
                    report(status, error)
                    if status == RunnerStatus.FAILED:
                        self._fail_streams(f"the {self.kind} failed: {error}")
                        raise RunnerDied(error or f"the {self.kind} failed")
                case RunnerChunkOut(chunk=chunk):
                    self._route(chunk)

    def _route(self, chunk: Chunk) -> None:
        stream = self._streams.get(chunk.task_id)
        if stream is None:
            return
        try:
            stream.send_nowait(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._streams.pop(chunk.task_id, None)  # the caller left
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
            raise RunnerDied(f"the {self.kind} is not running")
        try:
            self._conn.send_bytes(encode_frame(message))
        except (OSError, ValueError) as e:
            raise RunnerDied(f"the {self.kind} is gone: {e}") from e

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        send, receive = anyio.create_memory_object_stream[Chunk](math.inf)
        self._streams[task.task_id] = send
        self._send(RunnerSubmit(task_id=task.task_id, params=task.params, image=task.image))
        async with receive:
            async for chunk in receive:
                yield chunk

    async def cancel(self, task_id: TaskId) -> None:
        if task_id in self._streams:
            self._send(RunnerCancel(task_id=task_id))

    async def stop(self) -> None:
        self._stopping = True
        if self._conn is not None:
            with suppress(OSError, ValueError):
                self._conn.send_bytes(encode_frame(RunnerShutdown()))
        await self._end_process()

    async def _end_process(self) -> None:
        """Wait for a clean exit, then terminate, then kill: the child never outlives us."""
        process = self._process
        if process is not None:
            await anyio.to_thread.run_sync(process.join, STOP_GRACE_S)
            if process.is_alive():
                logger.warning(f"{self.kind} {self.spec.runner_id} did not stop; terminating it")
                process.terminate()
                await anyio.to_thread.run_sync(process.join, 2.0)
            if process.is_alive():
                process.kill()
                await anyio.to_thread.run_sync(process.join, 2.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._process = None


# -- the child's side --------------------------------------------------------------------------


class RunnerOutbox:
    """Frames to the parent; sends are serialized (a watchdog thread may send too)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: FromRunner) -> None:
        with self._lock:
            self._conn.send_bytes(encode_frame(message))

    def status(self, status: RunnerStatus, error: str | None = None) -> None:
        self.send(RunnerStatusUpdate(status=status, error=error))

    def chunk(self, chunk: Chunk) -> None:
        self.send(RunnerChunkOut(chunk=chunk))


def start_request_reader(
    conn: Connection,
    deliver: Callable[[ToRunner], None],
    on_closed: Callable[[], None] | None = None,
) -> threading.Thread:
    """Read the parent's requests on a daemon thread and hand each to `deliver`.

    When the parent goes away the pipe closes: then `on_closed` runs, by default delivering
    a `RunnerShutdown` so the serving loop ends as if asked."""

    def read() -> None:
        try:
            while True:
                deliver(decode_to_runner(conn.recv_bytes()))
        except (EOFError, OSError):
            if on_closed is None:
                deliver(RunnerShutdown())
            else:
                on_closed()

    thread = threading.Thread(target=read, name="exo-runner-requests", daemon=True)
    thread.start()
    return thread


def report_load_failure(out: RunnerOutbox, error: Exception) -> None:
    """The trace goes to the log; the parent (and so the state and clients) gets words only."""
    logger.opt(exception=error).error("loading the model failed")
    out.status(RunnerStatus.FAILED, f"loading failed: {public_message(error)}")


def run_runner_child(conn: Connection, serve: Callable[[], int]) -> NoReturn:
    """The frame of a child's entry point: log without local variables (they hold prompts),
    serve, close the pipe, exit with `serve`'s code."""
    logger.remove()
    logger.add(sys.stderr, level="INFO", diagnose=False)
    code = serve()
    conn.close()
    sys.exit(code)
