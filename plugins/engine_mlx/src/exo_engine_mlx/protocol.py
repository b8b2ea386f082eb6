"""What an MLX runner subprocess is started with; the messages on its pipe are the core's
(`exo_core.plugin.RunnerSubmit` and the others)."""

from __future__ import annotations

import msgspec

from exo_core.plugin.engine import RunnerSpec

# Prompt tokens prefilled per step (EXO_PREFILL_CHUNK). A step prefills one chunk of the prompts
# being read and then decodes one token of every running stream, so a running stream pauses for
# at most one chunk while a long prompt arrives (2048, mlx-lm's step, paused it ~20 s for a 2k
# prompt on SmolLM2 on a busy 2-core CPU); a smaller chunk costs a lone prompt little, since
# each chunk's rows still fill the matrix multiplies.
PREFILL_CHUNK = 256

# The shortest stored prefix a prompt reuses (EXO_MIN_PREFIX_TOKENS). A hit costs a copy of the
# stored KV, far less than the model on those tokens: two chats whose system messages differ
# after a few words share ~6 tokens, which the 1B reads in ~60 ms (first token 310 -> 250 ms;
# SmolLM2 ~12 ms less). llama.cpp reuses any common prefix; 8 left these to be read again.
MIN_PREFIX_TOKENS = 4


class RunnerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of one runner process (from the environment of the node)."""

    max_concurrent: int = 8
    # "auto": dense fp32 weights when the model is small; "on"/"off" force it.
    dense: str = "auto"
    prefix_cache_bytes: int = 512 * 1024 * 1024
    min_prefix_tokens: int = MIN_PREFIX_TOKENS
    default_max_tokens: int = 2048
    # Prompt tokens prefilled per step (PREFILL_CHUNK); a longer prompt reports its progress
    # after each step.
    prefill_step_size: int = PREFILL_CHUNK
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
