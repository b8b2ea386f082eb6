"""Output parsers turn a model's raw text stream into text, thinking and tool-call chunks.

A model card names its parsers (`reasoning_parser`, `tool_parser`); plugins register parser
factories by name through the `exo_output_parsers` hook.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from exo_core.generation import Chunk, GenerationParams, TextChunk
from exo_core.model_cards import ModelCard


class OutputParser(abc.ABC):
    """A streaming parser: text in, chunks out. It may hold back text that could start a tag."""

    @abc.abstractmethod
    def feed(self, chunk: TextChunk) -> list[Chunk]:
        """Parse one text chunk; return what is complete so far."""

    @abc.abstractmethod
    def finish(self, task_id: str) -> list[Chunk]:
        """The stream ended: return whatever was held back."""


ParserFactory = Callable[[ModelCard, GenerationParams], OutputParser]


class ChainedParser(OutputParser):
    """Runs parsers one after another: each one's text output feeds the next."""

    def __init__(self, parsers: list[OutputParser]) -> None:
        self._parsers = parsers

    def _through(self, chunks: list[Chunk], start: int) -> list[Chunk]:
        for parser in self._parsers[start:]:
            out: list[Chunk] = []
            for chunk in chunks:
                out.extend(parser.feed(chunk) if isinstance(chunk, TextChunk) else [chunk])
            chunks = out
        return chunks

    def feed(self, chunk: TextChunk) -> list[Chunk]:
        return self._through([chunk], 0)

    def finish(self, task_id: str) -> list[Chunk]:
        out: list[Chunk] = []
        for i, parser in enumerate(self._parsers):
            out.extend(self._through(parser.finish(task_id), i + 1))
        return out
