"""The worker's side of an MLX runner: the core's `SubprocessRunner` with MLX's launch settings
and, for a rank of a multi-node instance, its ring hostfile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from exo_core.plugin import RunnerSpec, RunnerStatus, SubprocessRunner
from exo_engine_mlx.distributed.group import group_env, ring_addresses
from exo_engine_mlx.protocol import Launch, RunnerOptions, encode
from exo_engine_mlx.runner_process import main as runner_main


class MlxRunner(SubprocessRunner):
    def __init__(self, spec: RunnerSpec, options: RunnerOptions, env: Mapping[str, str]) -> None:
        launch = encode(Launch(spec=spec, options=options))
        super().__init__(spec, env, entry=runner_main, launch=launch)
        self.options = options
        self._scratch: str | None = None

    def child_env(self) -> Mapping[str, str]:
        """The runner's environment; a rank of a group also gets its ring hostfile."""
        if self.spec.shard.world_size <= 1:
            return self.env
        self._scratch = tempfile.mkdtemp(prefix=f"exo-{self.spec.runner_id}-")
        return {**self.env, **group_env(self.spec, Path(self._scratch))}

    def exit_reason(self, exit_code: int | None) -> str:
        if self.status == RunnerStatus.CONNECTING:
            # The runner's own timer ended it while it waited for its peers.
            peers = ", ".join(ring_addresses(self.spec.instance))
            return (
                f"the runner group did not form within {self.options.group_connect_timeout_s:g} s: "
                f"rank {self.spec.shard.rank} could not connect to its peers ({peers}); "
                "a peer is unreachable, not started, or its port is taken"
            )
        return super().exit_reason(exit_code)

    async def stop(self) -> None:
        await super().stop()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
