"""What an image runner subprocess is started with; the messages on its pipe are the core's
(`exo_core.plugin.RunnerSubmit` and the others)."""

from __future__ import annotations

import msgspec

from exo_core.plugin import RunnerSpec


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    spec: RunnerSpec
    # A short generation before READY, so the first request pays no first-call costs.
    warmup: bool = True


encode = msgspec.msgpack.Encoder().encode
decode_launch = msgspec.msgpack.Decoder(Launch).decode
