"""For inference engine plugins: the engine and runner protocols, the subprocess runner's
child side and frames, the ring that joins an instance's ranks, and the fast BLAS a runner
preloads."""

from __future__ import annotations

from exo_core.blas import (
    blas_threads,
    find_fast_blas,
    loaded_blas,
    runner_env,
    usable_cores,
)
from exo_core.cluster_key import derive as derive_key
from exo_core.durable import replace_durably
from exo_core.engine import Engine, Runner, RunnerDied, RunnerSpec, StatusReporter
from exo_core.ring import (
    RING_TOKEN_ENV,
    FollowerFinals,
    GroupRunner,
    any_rank,
    barrier,
    broadcast,
    group_env,
    join_group,
    ring_peers_lost,
    ring_token,
    start_rank_reader,
)
from exo_core.subprocess_runner import (
    RunnerCancel,
    RunnerOutbox,
    RunnerShutdown,
    RunnerSubmit,
    SubprocessRunner,
    ToRunner,
    report_load_failure,
    run_runner_child,
    start_request_reader,
)
from exo_core.watchdog import Watchdog

__all__ = [
    # the ring between an instance's ranks
    "RING_TOKEN_ENV",
    # protocols
    "Engine",
    "FollowerFinals",
    "GroupRunner",
    "Runner",
    # the runner subprocess's side
    "RunnerCancel",
    "RunnerDied",
    "RunnerOutbox",
    "RunnerShutdown",
    "RunnerSpec",
    "RunnerSubmit",
    "StatusReporter",
    "SubprocessRunner",
    "ToRunner",
    "Watchdog",
    "any_rank",
    "barrier",
    # the fast BLAS
    "blas_threads",
    "broadcast",
    "derive_key",
    "find_fast_blas",
    "group_env",
    "join_group",
    "loaded_blas",
    # files
    "replace_durably",
    "report_load_failure",
    "ring_peers_lost",
    "ring_token",
    "run_runner_child",
    "runner_env",
    "start_rank_reader",
    "start_request_reader",
    "usable_cores",
]
