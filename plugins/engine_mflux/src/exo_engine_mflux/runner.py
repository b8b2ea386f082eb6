"""The worker's side of an image runner: the core's `GroupRunner` (a subprocess, maybe one rank
of a group with its ring hostfile), text tasks refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from exo_core.plugin import Chunk, ErrorChunk, Task
from exo_core.plugin.engine import GroupRunner, RunnerSpec
from exo_engine_mflux.protocol import Launch, encode
from exo_engine_mflux.runner_process import main as runner_main


class ImageRunner(GroupRunner):
    kind = "image runner"

    def __init__(
        self,
        spec: RunnerSpec,
        env: Mapping[str, str],
        warmup: bool = True,
        connect_timeout_s: float = 60.0,
    ) -> None:
        launch = encode(Launch(spec=spec, warmup=warmup, connect_timeout_s=connect_timeout_s))
        super().__init__(spec, env, entry=runner_main, launch=launch)
        self.warmup = warmup
        self.connect_timeout_s = connect_timeout_s

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        if task.image is None:
            yield ErrorChunk(task_id=task.task_id, message="an image model cannot generate text")
            return
        async for chunk in super().generate(task):
            yield chunk
