"""What an MLX runner subprocess is started with; the messages on its pipe are the core's
(`exo_core.plugin.RunnerSubmit` and the others)."""

from __future__ import annotations

import msgspec

from exo_core.plugin.engine import RunnerSpec


class RunnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of one runner process (from the environment of the node)."""

    max_concurrent: int = 8
    # "auto": dense fp32 weights when the model is small; "on"/"off" force it.
    dense: str = "auto"
    prefix_cache_bytes: int = 512 * 1024 * 1024
    min_prefix_tokens: int = 8
    default_max_tokens: int = 2048
    # Prompt tokens prefilled per step; a longer prompt reports its progress after each step.
    prefill_step_size: int = 2048
    warmup: bool = True
    # Runner groups (instances over several nodes): how long forming the ring, loading on
    # every rank, and one step may take before the runner gives up with an error, and how
    # often an idle rank 0 shows the others it is alive.
    group_connect_timeout_s: float = 60.0
    group_load_timeout_s: float = 600.0
    group_step_timeout_s: float = 60.0
    group_heartbeat_s: float = 2.0


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    spec: RunnerSpec
    options: RunnerOptions


encode = msgspec.msgpack.Encoder().encode
decode_launch = msgspec.msgpack.Decoder(Launch).decode
