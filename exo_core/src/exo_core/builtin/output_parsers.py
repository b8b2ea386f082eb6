# ruff: noqa: RUF002  (DeepSeek's markers are fullwidth characters by design)
"""Parsers the core ships: `think` (<think>…</think> blocks), `hermes` (<tool_call> JSON), and
DeepSeek's DSML tool calls: `deepseek_v32` (<｜DSML｜function_calls>) and `deepseek_v4`
(<｜DSML｜tool_calls>)."""

from __future__ import annotations

from exo_core.dsml import V4_BLOCK, V32_BLOCK, DsmlToolParser
from exo_core.generation import GenerationParams
from exo_core.hookspecs import hookimpl
from exo_core.model_cards import ModelCard
from exo_core.parsers import (
    HermesCallStream,
    OutputParser,
    ParserFactory,
    ThinkParser,
    ToolBlockParser,
    read_hermes,
)


class HermesToolParser(ToolBlockParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes a tool call chunk."""

    def __init__(self) -> None:
        super().__init__("<tool_call>", "</tool_call>", read_hermes, HermesCallStream)


def _think(card: ModelCard, params: GenerationParams) -> OutputParser:
    return ThinkParser()


def _hermes(card: ModelCard, params: GenerationParams) -> OutputParser:
    return HermesToolParser()


def _deepseek_v32(card: ModelCard, params: GenerationParams) -> OutputParser:
    return DsmlToolParser(V32_BLOCK)


def _deepseek_v4(card: ModelCard, params: GenerationParams) -> OutputParser:
    return DsmlToolParser(V4_BLOCK)


@hookimpl
def exo_output_parsers() -> dict[str, ParserFactory]:
    return {
        "think": _think,
        "hermes": _hermes,
        "deepseek_v32": _deepseek_v32,
        "deepseek_v4": _deepseek_v4,
    }
