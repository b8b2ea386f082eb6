"""Output parsers (the `exo_output_parsers` hook): thinking blocks and tool calls in a model's
text, and the tool-call argument stream."""

from __future__ import annotations

from exo_core.dsml import V4_BLOCK, V32_BLOCK, DsmlCallStream, read_dsml
from exo_core.parsers import (
    CallFragment,
    CallStream,
    ChainedParser,
    HermesCallStream,
    OutputParser,
    ParserFactory,
    ThinkParser,
    ToolBlockParser,
    ToolCallParseError,
    speaks_harmony,
    split_held,
    thinking_switch,
    tool_call,
)
from exo_core.tool_arguments import ArgumentStream

__all__ = [
    "V4_BLOCK",
    "V32_BLOCK",
    "ArgumentStream",
    "CallFragment",
    "CallStream",
    "ChainedParser",
    "DsmlCallStream",
    "HermesCallStream",
    "OutputParser",
    "ParserFactory",
    "ThinkParser",
    "ToolBlockParser",
    "ToolCallParseError",
    "read_dsml",
    "speaks_harmony",
    "split_held",
    "thinking_switch",
    "tool_call",
]
