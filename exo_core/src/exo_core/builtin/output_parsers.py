"""Parsers the core ships: `think` (<think>…</think> blocks) and `hermes` (<tool_call> JSON)."""

from __future__ import annotations

from exo_core.generation import GenerationParams
from exo_core.hookspecs import hookimpl
from exo_core.model_cards import ModelCard
from exo_core.parsers import (
    OutputParser,
    ParserFactory,
    ThinkParser,
    ToolBlockParser,
    read_hermes,
)


class HermesToolParser(ToolBlockParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes a tool call chunk."""

    def __init__(self) -> None:
        super().__init__("<tool_call>", "</tool_call>", read_hermes)


def _think(card: ModelCard, params: GenerationParams) -> OutputParser:
    return ThinkParser()


def _hermes(card: ModelCard, params: GenerationParams) -> OutputParser:
    return HermesToolParser()


@hookimpl
def exo_output_parsers() -> dict[str, ParserFactory]:
    return {"think": _think, "hermes": _hermes}
