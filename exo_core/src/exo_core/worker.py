"""The worker: makes this node do what state says it should.

It reconciles after each change of state: a runner for every shard placed here (fetching the
model first), no runner for a deleted instance, an execution for every task of a local instance,
and a cancel for every execution whose task left state. Runners that die are restarted with
exponential backoff; after `MAX_FAILURES` in a row (with no READY between them) the instance is
deleted. What to do is decided by the pure functions of `exo_core.worker_plan`; this module
carries it out (runners, downloads, chunks, timers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import anyio
import msgspec
from anyio.abc import TaskGroup
from loguru import logger

from exo_core.commands import Command, CommandResult, DeleteInstance, ReportEvents
from exo_core.downloads import Downloader, DownloadFailed
from exo_core.engine import Engine, Runner, RunnerDied, RunnerSpec
from exo_core.events import DownloadProgressed, Event, RunnerStatusChanged, TaskStatusChanged
from exo_core.generation import Chunk, ErrorChunk, FinishChunk
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.redact import public_message
from exo_core.replica import Replica
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    Instance,
    RunnerInfo,
    RunnerStatus,
    ShardAssignment,
    State,
    Task,
    TaskStatus,
)
from exo_core.trust import RunRefused
from exo_core.worker_plan import (
    NO_ANSWER,
    CancelExecution,
    GiveUp,
    Held,
    Restart,
    RetryPolicy,
    RunTask,
    StartRunner,
    StopRunner,
    WorkerAction,
    after_failure,
    peers_started,
    plan,
    stage_times,
    task_outcome,
)

MAX_FAILURES = 3
# How long a task waits for its runner to become READY (downloads not counted) before it fails
# with the runner's status, instead of hanging its caller.
READY_TIMEOUT_S = float(os.environ.get("EXO_RUNNER_READY_TIMEOUT_S", "900"))
BACKOFF_BASE_S = 2.0
BACKOFF_CAP_S = 30.0

SendCommand = Callable[[Command], Awaitable[CommandResult]]
SendChunk = Callable[[NodeId, Chunk], Awaitable[None]]
# Rank 0 gets the task as its caller asked for it (the log holds no request text).
FetchBody = Callable[[Task], Awaitable[Task]]
CardLookup = Callable[[ModelId], ModelCard | None]
# The card as this node runs it, or `RunRefused` (see `exo_core.trust.card_to_run`).
CardToRun = Callable[[ModelCard], ModelCard]


def retry_policy() -> RetryPolicy:
    """The policy from this module's settings (read at each failure: tests shorten them)."""
    return RetryPolicy(max_failures=MAX_FAILURES, base_s=BACKOFF_BASE_S, cap_s=BACKOFF_CAP_S)


def backoff_delay(failures: int) -> float:
    """Seconds to wait before restart number `failures` (1-based): 2, 4, 8, 16, 30, 30..."""
    return retry_policy().delay(failures)


class _Local:
    """A runner this node supervises."""

    def __init__(self, instance: Instance, shard: ShardAssignment) -> None:
        self.instance = instance
        self.shard = shard
        self.runner: Runner | None = None
        self.status = RunnerStatus.PENDING
        self.since = time.time()
        self.stage_seconds: dict[str, float] = {}
        self.ready = anyio.Event()
        self.scope = anyio.CancelScope()
        self.model_path = ""
        #: The engine running it (see `from_engine`), once one is chosen.
        self.engine = ""


def from_engine(engine: str, message: str | None) -> str | None:
    """`message` (a runner's or a task's error) naming the engine it came from, once."""
    if not message or not engine:
        return message
    prefix = f"engine {engine}: "
    return message if message.startswith(prefix) else prefix + message


class Worker:
    def __init__(
        self,
        node_id: NodeId,
        replica: Replica,
        engines: list[Engine],
        downloader: Downloader | None,
        cards: CardLookup,
        all_cards: Callable[[], Mapping[ModelId, ModelCard]],
        send_command: SendCommand,
        send_chunk: SendChunk,
        models_dir: Path,
        data_dir: Path,
        fetch_body: FetchBody | None = None,
        card_to_run: CardToRun = lambda card: card,
        downloads: bool = True,
    ) -> None:
        self.node_id = node_id
        # False (`--no-downloads`): only models already on disk run here; nothing is fetched.
        self._downloads = downloads
        self._replica = replica
        self._engines = engines
        self._downloader = downloader
        self._cards = cards
        self._all_cards = all_cards
        self._send_command = send_command
        self._send_chunk = send_chunk
        self._fetch_body = fetch_body
        self._card_to_run = card_to_run
        self._models_dir = models_dir
        self._data_dir = data_dir
        self._locals: dict[RunnerId, _Local] = {}
        self._failures: dict[InstanceId, int] = {}
        self._executions: dict[TaskId, anyio.CancelScope] = {}
        self._cancelling: set[TaskId] = set()
        self._outbox: list[Event] = []
        self._outbox_ready = anyio.Event()
        self._tg: TaskGroup | None = None

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._report_loop)
                self._report_models_on_disk()
                while True:
                    self.reconcile(self._replica.state)
                    await self._replica.wait_change()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_all()

    async def _stop_all(self) -> None:
        for local in list(self._locals.values()):
            if local.runner is not None:
                await local.runner.stop()

    def reconcile(self, state: State) -> None:
        held = Held(
            runners={runner_id: x.instance.instance_id for runner_id, x in self._locals.items()},
            executing=frozenset(self._executions),
            cancelling=frozenset(self._cancelling),
        )
        for action in plan(state, self.node_id, held):
            self._act(action)

    def runner_pids(self) -> dict[RunnerId, int]:
        """The processes of this node's runners that run in one of their own (telemetry)."""
        pids = {rid: local.runner.pid for rid, local in self._locals.items() if local.runner}
        return {rid: pid for rid, pid in pids.items() if pid is not None}

    def _act(self, action: WorkerAction) -> None:
        assert self._tg is not None
        match action:
            case StartRunner(instance=instance, shard=shard):
                local = self._locals[shard.runner_id] = _Local(instance, shard)
                self._tg.start_soon(self._supervise, local)
            case StopRunner(runner_id=runner_id, instance_id=instance_id):
                self._locals.pop(runner_id).scope.cancel()
                self._failures.pop(instance_id, None)
            case RunTask(task=task, runner_id=runner_id):
                scope = self._executions[task.task_id] = anyio.CancelScope()
                self._tg.start_soon(self._execute, self._locals[runner_id], task, scope)
            case CancelExecution(task_id=task_id):
                self._cancelling.add(task_id)
                self._tg.start_soon(self._cancel, task_id, self._executions[task_id])

    # -- reporting ----------------------------------------------------------------------------

    def report(self, event: Event) -> None:
        """Queue a fact for the log; sent in order, retried until the master takes it."""
        self._outbox.append(event)
        self._outbox_ready.set()

    async def _report_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready = anyio.Event()
            batch, self._outbox = self._outbox, []
            while batch:
                try:
                    result = await self._send_command(ReportEvents(events=tuple(batch)))
                    if not result.ok:
                        logger.error(f"master refused a report: {result.message}")
                    batch = []
                except Exception as e:
                    logger.debug(f"report failed, retrying: {e!r}")
                    await anyio.sleep(0.5)

    def _report_models_on_disk(self) -> None:
        """Say which models this node already holds, so placement can prefer it."""
        if self._downloader is None:
            return
        for card in self._all_cards().values():
            if not self._needs_download(card):
                continue
            try:
                path = self._downloader.find_local(card)
            except Exception as e:  # a broken directory must not stop the worker
                logger.warning(f"could not look for {card.model_id} on disk: {e!r}")
                continue
            if path is not None:
                self._report_complete(card, path)

    def _report_complete(self, card: ModelCard, path: Path) -> None:
        done = self._replica.state.downloads.get(self.node_id, {}).get(card.model_id)
        if done is not None and done.status == DownloadStatus.COMPLETED and done.path == str(path):
            return
        size = card.storage_size_bytes
        self.report(
            DownloadProgressed(
                progress=DownloadProgress(
                    node_id=self.node_id,
                    model_id=card.model_id,
                    status=DownloadStatus.COMPLETED,
                    downloaded_bytes=size,
                    total_bytes=size,
                    path=str(path),
                )
            )
        )

    def _set_status(self, local: _Local, status: RunnerStatus, error: str | None = None) -> None:
        local.since, local.stage_seconds = stage_times(
            local.status, local.since, local.stage_seconds, status, time.time()
        )
        local.status = status
        if status == RunnerStatus.READY:
            # The counter counts failures in a row: a runner that came up again starts over.
            self._failures.pop(local.instance.instance_id, None)
            local.ready.set()
        elif status != RunnerStatus.RUNNING:
            local.ready = anyio.Event() if local.ready.is_set() else local.ready
        failures = self._failures.get(local.instance.instance_id, 0)
        self.report(
            RunnerStatusChanged(
                runner=RunnerInfo(
                    runner_id=local.shard.runner_id,
                    instance_id=local.instance.instance_id,
                    node_id=self.node_id,
                    status=status,
                    error=error,
                    failures=failures,
                    since=local.since,
                    stage_seconds=dict(local.stage_seconds),
                    model_path=local.model_path,
                )
            )
        )

    async def download(self, card: ModelCard) -> Path:
        """Fetch a model to this node without running it (`exo pull`); progress, completion and
        failure reach state like a placement's download. Raises `DownloadFailed`."""
        engine = self._engine_for(card)
        if engine is not None and not engine.needs_download:
            return await engine.prepare_model(card, self._models_dir) or self._models_dir
        try:
            path = await self._fetch(card)
        except DownloadFailed as e:
            failed = DownloadProgress(
                node_id=self.node_id,
                model_id=card.model_id,
                status=DownloadStatus.FAILED,
                error=str(e),
            )
            self.report(DownloadProgressed(progress=failed))
            raise
        self._report_complete(card, path)
        return path

    async def _fetch(self, card: ModelCard, starting: Callable[[], None] = lambda: None) -> Path:
        """The model's local copy, found (reported complete) or downloaded (`starting` is
        called first; the downloader's progress is reported as this node's)."""
        if self._downloader is None:
            raise DownloadFailed(f"no downloader is installed to fetch {card.model_id}")
        found = self._downloader.find_local(card)
        if found is not None:
            self._report_complete(card, found)
            return found
        if not self._downloads:
            raise DownloadFailed(
                f"{card.model_id} is not on disk and this node runs with --no-downloads"
            )
        starting()

        def progress(p: DownloadProgress) -> None:
            # Progress always names this node, whatever the downloader knows of it.
            self.report(
                DownloadProgressed(progress=msgspec.structs.replace(p, node_id=self.node_id))
            )

        return await self._downloader.ensure(card, progress)

    # -- runners ------------------------------------------------------------------------------

    def _engine_for(self, card: ModelCard) -> Engine | None:
        return next((e for e in self._engines if e.can_serve(card)), None)

    def _needs_download(self, card: ModelCard) -> bool:
        engine = self._engine_for(card)
        return engine is None or engine.needs_download

    async def _prepare(self, local: _Local, card: ModelCard, engine: Engine) -> Path:
        own = await engine.prepare_model(card, self._models_dir)
        if own is not None:
            return own
        if not engine.needs_download:
            return self._models_dir
        return await self._fetch(card, lambda: self._set_status(local, RunnerStatus.DOWNLOADING))

    async def _supervise(self, local: _Local) -> None:
        instance_id = local.instance.instance_id
        with local.scope:
            while True:
                runner: Runner | None = None
                try:
                    known = self._cards(local.instance.model_id)
                    if known is None:
                        raise RunnerDied(f"unknown model {local.instance.model_id}")
                    try:
                        card = self._card_to_run(known)
                    except RunRefused as e:
                        logger.warning(f"not running {known.model_id}: {e}")
                        await self._refuse(local, str(e))
                        return
                    engine = self._engine_for(card)
                    if engine is None:
                        raise RunnerDied(f"no engine on this node can serve {card.model_id}")
                    local.engine = engine.name or type(engine).__name__
                    path = await self._prepare(local, card, engine)
                    local.model_path = str(path)
                    if local.shard.world_size > 1:
                        # A group forms only when every rank can start: wait for the others'
                        # downloads rather than time out connecting to them.
                        self._set_status(local, RunnerStatus.CONNECTING)
                        await self._peers_ready(local)
                    spec = RunnerSpec(
                        runner_id=local.shard.runner_id,
                        instance=local.instance,
                        shard=local.shard,
                        card=card,
                        model_path=str(path),
                        data_dir=str(self._data_dir),
                    )
                    runner = local.runner = engine.create_runner(spec)
                    await runner.serve(
                        lambda s, err: self._set_status(local, s, from_engine(local.engine, err))
                    )
                    self._set_status(local, RunnerStatus.STOPPED)
                    return
                except Exception as e:
                    failures = self._failures.get(instance_id, 0) + 1
                    self._failures[instance_id] = failures
                    message = from_engine(local.engine, public_message(e)) or ""
                    logger.opt(exception=e).error(
                        f"runner {local.shard.runner_id} failed ({failures}x): {message}"
                    )
                    self._set_status(local, RunnerStatus.FAILED, message)
                    match after_failure(failures, message, retry_policy()):
                        case GiveUp(reason=reason):
                            await self._delete_instance(instance_id, reason)
                            return
                        case Restart(delay_s=delay_s):
                            await anyio.sleep(delay_s)
                finally:
                    if runner is not None:
                        with anyio.CancelScope(shield=True):
                            await runner.stop()
                    local.runner = None

    async def _refuse(self, local: _Local, reason: str) -> None:
        """This node will not run the card as given: no retries, the instance goes, and the
        reason reaches its callers (and the runner's status)."""
        self._set_status(local, RunnerStatus.FAILED, reason)
        await self._delete_instance(local.instance.instance_id, reason)

    async def _peers_ready(self, local: _Local) -> None:
        while not peers_started(self._replica.state, local.instance, local.shard.runner_id):
            await self._replica.wait_change()

    async def _delete_instance(self, instance_id: InstanceId, reason: str) -> None:
        for _ in range(20):
            try:
                await self._send_command(DeleteInstance(instance_id=instance_id, reason=reason))
                return
            except Exception as e:
                logger.debug(f"delete of {instance_id} failed, retrying: {e!r}")
                await anyio.sleep(0.5)

    # -- tasks --------------------------------------------------------------------------------

    async def _execute(self, local: _Local, task: Task, scope: anyio.CancelScope) -> None:
        leader = local.shard.rank == 0
        final: FinishChunk | ErrorChunk | None = None
        try:
            with scope:
                if leader and self._fetch_body is not None:
                    # The log holds no request text: rank 0 gets it from the caller's node.
                    task = await self._fetch_body(task)
                await self._wait_ready(local)
                runner = local.runner
                if runner is None:
                    raise RunnerDied("the runner is not running")
                if leader:
                    self.report(TaskStatusChanged(task_id=task.task_id, status=TaskStatus.RUNNING))
                async for chunk in runner.generate(task):
                    if isinstance(chunk, FinishChunk | ErrorChunk):
                        final = chunk
                    if leader:
                        await self._send_chunk(task.origin_node, chunk)
        except Exception as e:
            logger.opt(exception=e).error(f"task {task.task_id} failed")
            final = ErrorChunk(
                task_id=task.task_id,
                message=from_engine(local.engine, f"generation failed: {public_message(e)}") or "",
            )
            if leader:
                await self._safe_send(task.origin_node, final)
        finally:
            self._executions.pop(task.task_id, None)
            self._cancelling.discard(task.task_id)
        if not leader:
            return
        if final is None:
            await self._safe_send(
                task.origin_node, ErrorChunk(task_id=task.task_id, message=NO_ANSWER)
            )
        status, error = task_outcome(final)
        self.report(TaskStatusChanged(task_id=task.task_id, status=status, error=error))

    async def _wait_ready(self, local: _Local) -> None:
        waited = 0.0
        while not local.ready.is_set():
            with anyio.move_on_after(1.0):
                await local.ready.wait()  # re-read each time: a status change replaces it
            if local.status != RunnerStatus.DOWNLOADING:
                waited += 1.0
            if waited >= READY_TIMEOUT_S and not local.ready.is_set():
                message = (
                    f"runner {local.shard.runner_id} did not become ready within "
                    f"{READY_TIMEOUT_S:.0f} s (it is {local.status})"
                )
                logger.error(message)
                raise RunnerDied(message)

    async def _safe_send(self, node: NodeId, chunk: Chunk) -> None:
        try:
            await self._send_chunk(node, chunk)
        except Exception as e:
            logger.warning(f"could not deliver the end of task {chunk.task_id}: {e!r}")

    async def _cancel(self, task_id: TaskId, scope: anyio.CancelScope) -> None:
        """The task left state (cancelled, or its caller went away): stop generating it."""
        for local in self._locals.values():
            if local.runner is not None:
                try:
                    await local.runner.cancel(task_id)
                except Exception as e:
                    logger.debug(f"cancel of {task_id} failed: {e!r}")
        # The runner ends the stream within a few tokens; cut it off if it does not.
        await anyio.sleep(5)
        if task_id in self._executions:
            scope.cancel()
