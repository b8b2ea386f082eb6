"""A deterministic engine for tests: its output follows from the request, never from weights.

Register `ScriptedEnginePlugin()` on a node's plugin manager. Its model card
`scripted-echo` answers:

* `echo: <last user text>`, one word per token;
* a Hermes `<tool_call>` for the first tool, when tools are given and the last message is the
  user's (arguments: `{"query": <last user text>}`);
* `tool said: <tool result>` when the last message is a tool result;
* `<think>pondering</think>` first, when the card has the thinking capability
  (`scripted-thinker`).

It honours max_tokens (in words), `ignore_eos`, `count_only`, stop sequences, cancellation,
and can be slowed per token. With `prefill_step` words, a longer prompt reports its prefill
progress a step at a time first (`KeepAliveChunk`s), as engine_mlx does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio

from exo_core.engine import Engine, Runner, RunnerSpec, StatusReporter
from exo_core.generation import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    KeepAliveChunk,
    TextChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from exo_core.hookspecs import hookimpl
from exo_core.ids import ModelId, TaskId
from exo_core.model_cards import Capability, ModelCard
from exo_core.state import RunnerStatus, Task

ECHO = ModelCard(
    model_id=ModelId("scripted-echo"),
    family="scripted",
    n_layers=4,
    hidden_size=64,
    num_key_value_heads=2,
    storage_size_bytes=1_000_000,
    supports_tensor=True,
    capabilities=(Capability.TEXT, Capability.TOOLS),
    source="scripted:echo",
    tool_parser="hermes",
)
THINKER = ModelCard(
    model_id=ModelId("scripted-thinker"),
    family="scripted",
    n_layers=4,
    hidden_size=64,
    storage_size_bytes=1_000_000,
    capabilities=(Capability.TEXT, Capability.THINKING, Capability.TOOLS),
    source="scripted:thinker",
    reasoning_parser="think",
    tool_parser="hermes",
)


def script(card: ModelCard, params: GenerationParams) -> str:
    """The full text the scripted model produces for a request."""
    if params.prompt is not None and not params.messages:
        return f"echo: {params.prompt}"
    if not params.messages:
        return "echo:"  # a rank other than 0 of a group: the body went to rank 0 only
    last = params.messages[-1]
    prefix = "<think>pondering</think>" if card.has(Capability.THINKING) else ""
    if last.role == "tool":
        return f"{prefix}tool said: {last.text()}"
    if params.tools and last.role == "user" and params.tool_choice != "none":
        call = {"name": params.tools[0].name, "arguments": {"query": last.text()}}
        return f"{prefix}<tool_call>{json.dumps(call)}</tool_call>"
    user = next((m.text() for m in reversed(params.messages) if m.role == "user"), "")
    return f"{prefix}echo: {user}"


def tokens(text: str) -> list[str]:
    """Words with their leading space, and tags as tokens of their own."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out.append(word if i == 0 else " " + word)
    return [t for t in out if t]


class ScriptedRunner(Runner):
    def __init__(
        self, spec: RunnerSpec, delay_s: float, fail_load: bool, prefill_step: int = 0
    ) -> None:
        self.spec = spec
        self.delay_s = delay_s
        self.fail_load = fail_load
        self.prefill_step = prefill_step
        self._stop = anyio.Event()
        self._cancelled: set[TaskId] = set()

    async def serve(self, report: StatusReporter) -> None:
        report(RunnerStatus.LOADING, None)
        await anyio.sleep(0.01)
        if self.fail_load:
            from exo_core.engine import RunnerDied

            raise RunnerDied("scripted load failure")
        report(RunnerStatus.WARMING_UP, None)
        report(RunnerStatus.READY, None)
        await self._stop.wait()

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        if self._stop.is_set():
            yield ErrorChunk(task_id=task.task_id, message="the runner is stopped")
            return
        prompt_tokens = sum(len(m.text().split()) for m in task.params.messages) or 1
        if task.params.count_only:
            usage = Usage(prompt_tokens=prompt_tokens)
            yield FinishChunk(task_id=task.task_id, finish_reason=FinishReason.STOP, usage=usage)
            return
        if 0 < self.prefill_step < prompt_tokens:
            for done in range(self.prefill_step, prompt_tokens, self.prefill_step):
                yield KeepAliveChunk(
                    task_id=task.task_id, prefill_processed=done, prefill_total=prompt_tokens
                )
                await anyio.sleep(self.delay_s)
        text = script(self.spec.card, task.params)
        pieces = tokens(text)
        limit = task.params.max_tokens
        if task.params.ignore_eos and limit is not None:
            pieces = (pieces * limit)[:limit]  # no end of sequence: say it again
        emitted = ""
        count = 0
        reason = FinishReason.STOP
        matched: str | None = None
        for piece in pieces:
            if task.task_id in self._cancelled:
                reason = FinishReason.CANCELLED
                break
            if limit is not None and count >= limit:
                reason = FinishReason.LENGTH
                break
            emitted += piece
            stop_at = next((s for s in task.params.stop if s in emitted), None)
            if stop_at is not None:
                matched = stop_at
                keep = emitted[: emitted.index(stop_at)]
                piece = (
                    keep[len(emitted) - len(piece) :]
                    if len(keep) > len(emitted) - len(piece)
                    else ""
                )
                if piece:
                    yield TextChunk(task_id=task.task_id, text=piece)
                count += 1
                break
            logprobs = (
                (
                    TokenLogprob(
                        token=piece,
                        logprob=-0.5,
                        top=tuple(
                            TopLogprob(piece if k == 0 else f"alt{k}", -0.5 - k)
                            for k in range(task.params.top_logprobs)
                        ),
                    ),
                )
                if task.params.logprobs
                else ()
            )
            yield TextChunk(task_id=task.task_id, text=piece, logprobs=logprobs)
            count += 1
            await anyio.sleep(self.delay_s)
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=count)
        yield FinishChunk(
            task_id=task.task_id, finish_reason=reason, usage=usage, stop_sequence=matched
        )

    async def cancel(self, task_id: TaskId) -> None:
        self._cancelled.add(task_id)

    async def stop(self) -> None:
        self._stop.set()


class ScriptedEngine(Engine):
    name = "scripted"
    needs_download = False  # its "models" are scripts: the downloader is never asked

    def __init__(
        self, delay_s: float = 0.0, fail_load: bool = False, prefill_step: int = 0
    ) -> None:
        self.delay_s = delay_s
        self.fail_load = fail_load
        self.prefill_step = prefill_step
        self.runners: list[ScriptedRunner] = []

    def can_serve(self, card: ModelCard) -> bool:
        return card.source.startswith("scripted:")

    def create_runner(self, spec: RunnerSpec) -> Runner:
        runner = ScriptedRunner(spec, self.delay_s, self.fail_load, self.prefill_step)
        self.runners.append(runner)
        return runner


class ScriptedEnginePlugin:
    """A plugin object: register it with `plugin_host.pm.register(ScriptedEnginePlugin())`."""

    def __init__(
        self, delay_s: float = 0.0, fail_load: bool = False, prefill_step: int = 0
    ) -> None:
        self.engine = ScriptedEngine(delay_s, fail_load, prefill_step)

    @hookimpl
    def exo_engines(self) -> list[Engine]:
        return [self.engine]

    @hookimpl
    def exo_model_cards(self) -> list[ModelCard]:
        return [ECHO, THINKER]
