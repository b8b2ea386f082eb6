"""The worker's side of an MLX runner: the core's `GroupRunner` (a `SubprocessRunner` that may be
one rank of a group, with its ring hostfile) with MLX's launch settings."""

from __future__ import annotations

from collections.abc import Mapping

from exo_core.plugin.engine import GroupRunner, RunnerSpec
from exo_engine_mlx.protocol import Launch, RunnerOptions, encode
from exo_engine_mlx.runner_process import main as runner_main


class MlxRunner(GroupRunner):
    def __init__(self, spec: RunnerSpec, options: RunnerOptions, env: Mapping[str, str]) -> None:
        launch = encode(Launch(spec=spec, options=options))
        super().__init__(spec, env, entry=runner_main, launch=launch)
        self.options = options
        self.connect_timeout_s = options.group_connect_timeout_s
