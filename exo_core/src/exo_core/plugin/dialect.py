"""For API dialect plugins: a router, body decoding, answers and streams in the dialect's own
wire format, and the sampling defaults a request falls back on."""

from __future__ import annotations

from exo_core.api.dialect import (
    NDJSON_MEDIA_TYPE,
    UNFINISHED,
    AnyRequest,
    GenerationFailed,
    answer,
    answered,
    decode_body,
    dialect_router,
    documented_body,
    exception_handlers,
    finish_failure,
    ndjson,
    sse,
)
from exo_core.api.errors import native_error
from exo_core.api.security import ACCEPTS_OPT
from exo_core.sampling_defaults import SamplingValues, resolve_sampling

__all__ = [
    "ACCEPTS_OPT",
    "NDJSON_MEDIA_TYPE",
    "UNFINISHED",
    "AnyRequest",
    "GenerationFailed",
    "SamplingValues",
    "answer",
    "answered",
    "decode_body",
    "dialect_router",
    "documented_body",
    "exception_handlers",
    "finish_failure",
    "native_error",
    "ndjson",
    "resolve_sampling",
    "sse",
]
