"""What an image runner subprocess is started with; the messages on its pipe are the core's
(`exo_core.plugin.RunnerSubmit` and the others)."""

from __future__ import annotations

import msgspec

from exo_core.plugin.engine import RunnerSpec


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    spec: RunnerSpec
    # A short generation before READY, so the first request pays no first-call costs.
    warmup: bool = True
    # A rank of a group: how long it waits for its peers, and for one step of the others.
    connect_timeout_s: float = 60.0
    step_timeout_s: float = 120.0


encode = msgspec.msgpack.Encoder().encode
decode_launch = msgspec.msgpack.Decoder(Launch).decode
