"""Parsers the core ships: `think` (<think>…</think> blocks) and `hermes` (<tool_call> JSON).

Both are streaming: text that might be the start of a tag is held back until it is decided.
"""

from __future__ import annotations

import json

from exo_core.generation import (
    Chunk,
    GenerationParams,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
)
from exo_core.hookspecs import hookimpl
from exo_core.ids import TaskId, new_id
from exo_core.model_cards import ModelCard
from exo_core.parsers import OutputParser, ParserFactory


def _split_held(text: str, tag: str) -> tuple[str, str]:
    """Split `text` into (safe, held): `held` is the longest suffix that is a prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return text[:-n], text[-n:]
    return text, ""


class TaggedBlockParser(OutputParser):
    """Routes text between `open_tag` and `close_tag` elsewhere; subclasses say where."""

    open_tag = ""
    close_tag = ""

    def __init__(self, inside: bool = False) -> None:
        self._inside = inside
        self._buffer = ""

    def _outside(self, task_id: TaskId, text: str) -> list[Chunk]:
        return [TextChunk(task_id=task_id, text=text)] if text else []

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        raise NotImplementedError

    def feed(self, chunk: TextChunk) -> list[Chunk]:
        out: list[Chunk] = []
        text = self._buffer + chunk.text
        self._buffer = ""
        task_id = chunk.task_id
        first = True
        while text:
            tag = self.close_tag if self._inside else self.open_tag
            at = text.find(tag)
            if at >= 0:
                before, text = text[:at], text[at + len(tag) :]
                out.extend(
                    self._emit(task_id, before, closed=self._inside, chunk=chunk, first=first)
                )
                self._inside = not self._inside
                first = False
                continue
            safe, held = _split_held(text, tag)
            out.extend(self._emit(task_id, safe, closed=False, chunk=chunk, first=first))
            self._buffer = held
            break
        return out

    def _emit(
        self, task_id: TaskId, text: str, closed: bool, chunk: TextChunk, first: bool
    ) -> list[Chunk]:
        if self._inside:
            return self._block(task_id, text, closed)
        if not text:
            return []
        # Keep token logprobs on the text they came with (only exact when nothing was split).
        logprobs = chunk.logprobs if first else ()
        return [TextChunk(task_id=task_id, text=text, logprobs=logprobs)]

    def finish(self, task_id: str) -> list[Chunk]:
        text, self._buffer = self._buffer, ""
        if self._inside:
            return self._block(TaskId(task_id), text, closed=True)
        return self._outside(TaskId(task_id), text)


class ThinkParser(TaggedBlockParser):
    open_tag = "<think>"
    close_tag = "</think>"

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        return [ThinkingChunk(task_id=task_id, text=text)] if text else []


class HermesToolParser(TaggedBlockParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes a tool call chunk.

    A block that is not valid JSON comes out as plain text, so nothing the model said is lost."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._call = ""

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        self._call += text
        if not closed:
            return []
        raw, self._call = self._call.strip(), ""
        try:
            data = json.loads(raw)
            name = data["name"]
            arguments = data.get("arguments", data.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError("name is not a string")
        except (ValueError, KeyError, TypeError, AttributeError):
            return [TextChunk(task_id=task_id, text=f"{self.open_tag}{raw}{self.close_tag}")]
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call = ToolCall(id=new_id("call"), name=name, arguments=args)
        return [ToolCallChunk(task_id=task_id, call=call)]


def _think(card: ModelCard, params: GenerationParams) -> OutputParser:
    # Models whose template opens the think block in the prompt start inside it.
    return ThinkParser(inside=False)


def _hermes(card: ModelCard, params: GenerationParams) -> OutputParser:
    return HermesToolParser()


@hookimpl
def exo_output_parsers() -> dict[str, ParserFactory]:
    return {"think": _think, "hermes": _hermes}
