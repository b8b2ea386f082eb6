"""Output parsers turn a model's raw text stream into text, thinking and tool-call chunks.

A model card names its parsers (`reasoning_parser`, `tool_parser`); plugins register parser
factories by name through the `exo_output_parsers` hook. An engine that knows its model's
output format (its tokenizer names the think and tool-call markers) may parse on its own side
with the same classes, so its chunks reach the dialects already structured.

Every parser here is streaming: text that might be the start of a tag is held back until it
is decided, so a tag split across tokens is still found.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Collection, Sequence

from exo_core.generation import (
    Chunk,
    GenerationParams,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
)
from exo_core.ids import TaskId, new_id
from exo_core.model_cards import ModelCard

# gpt-oss's Harmony format: a vocabulary holding all of these markers speaks it. Here in the
# core because both the engine (to parse) and the downloader (to label a custom card) ask.
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>")


def speaks_harmony(vocabulary: Collection[str]) -> bool:
    """Whether a tokenizer vocabulary carries Harmony's markers (gpt-oss)."""
    return all(marker in vocabulary for marker in HARMONY_MARKERS)


# The variable a chat template switches thinking with: `enable_thinking` in most (Qwen 3, GLM,
# Nemotron 3), a bare `thinking` in DeepSeek V3.1's. Read from the Jinja tags only (comments
# and text do not count), and not as an attribute or a string (`m.thinking`, `'thinking'`).
_JINJA_TAG = re.compile(r"\{[{%](.*?)[}%]\}", re.DOTALL)
_BARE_THINKING = re.compile(r"(?<![\w.'\"])thinking(?![\w'\"])")


def thinking_switch(template: str) -> str | None:
    """The template variable that turns thinking on and off, or None when it reads neither."""
    if "enable_thinking" in template:
        return "enable_thinking"
    tags = _JINJA_TAG.findall(template)
    return "thinking" if any(_BARE_THINKING.search(tag) for tag in tags) else None


class OutputParser(abc.ABC):
    """A streaming parser: text in, chunks out. It may hold back text that could start a tag."""

    @abc.abstractmethod
    def feed(self, chunk: TextChunk) -> list[Chunk]:
        """Parse one text chunk; return what is complete so far."""

    @abc.abstractmethod
    def finish(self, task_id: str) -> list[Chunk]:
        """The stream ended: return whatever was held back."""

    @property
    def thinking(self) -> bool:
        """Whether the model is inside a thinking block now (for counting reasoning tokens)."""
        return False


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

    @property
    def thinking(self) -> bool:
        return any(p.thinking for p in self._parsers)

    def finish(self, task_id: str) -> list[Chunk]:
        out: list[Chunk] = []
        for i, parser in enumerate(self._parsers):
            out.extend(self._through(parser.finish(task_id), i + 1))
        return out


def split_held(text: str, tag: str) -> tuple[str, str]:
    """Split `text` into (safe, held): `held` is the longest suffix that is a prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return text[:-n], text[-n:]
    return text, ""


class TaggedBlockParser(OutputParser):
    """Routes text between `open_tag` and `close_tag` elsewhere; subclasses say where.

    An empty `close_tag` means the block runs to the end of the stream, or to the next
    `open_tag`, which then starts another block (Mistral's `[TOOL_CALLS]` has no end tag)."""

    def __init__(self, open_tag: str, close_tag: str, inside: bool = False) -> None:
        if not open_tag:
            raise ValueError("a tagged block needs an open tag")
        self.open_tag = open_tag
        self.close_tag = close_tag
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
            open_ended = self._inside and not self.close_tag
            tag = self.open_tag if open_ended or not self._inside else self.close_tag
            at = text.find(tag)
            if at >= 0:
                before, text = text[:at], text[at + len(tag) :]
                out.extend(
                    self._emit(task_id, before, closed=self._inside, chunk=chunk, first=first)
                )
                # An open tag inside an open-ended block ends it and starts the next one.
                self._inside = open_ended or not self._inside
                first = False
                continue
            safe, held = split_held(text, tag)
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
            return self._unclosed(TaskId(task_id), text)
        return self._outside(TaskId(task_id), text)

    def _unclosed(self, task_id: TaskId, text: str) -> list[Chunk]:
        """The stream ended inside a block."""
        return self._block(task_id, text, closed=True)


class ThinkParser(TaggedBlockParser):
    """Text inside the think tags becomes thinking chunks. `inside=True` starts in the block,
    for prompts whose template already opened it."""

    def __init__(
        self, open_tag: str = "<think>", close_tag: str = "</think>", inside: bool = False
    ) -> None:
        super().__init__(open_tag, close_tag, inside)

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        return [ThinkingChunk(task_id=task_id, text=text)] if text else []

    @property
    def thinking(self) -> bool:
        return self._inside


class ToolCallParseError(ValueError):
    """A tool-call block that its family's format cannot read."""


ToolBlockReader = Callable[[str], Sequence[ToolCall]]
"""Reads the text of one tool-call block (between its tags) into one or more calls; raises
`ToolCallParseError` (or ValueError) when the text is not a call."""


class ToolBlockParser(TaggedBlockParser):
    """A tool-call block between `open_tag` and `close_tag` becomes tool call chunks.

    A block that the reader refuses comes out as plain text, so nothing the model said is
    lost."""

    def __init__(self, open_tag: str, close_tag: str, read: ToolBlockReader) -> None:
        super().__init__(open_tag, close_tag)
        self._read = read
        self._call = ""

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        self._call += text
        if not closed:
            return []
        raw, self._call = self._call, ""
        try:
            calls = list(self._read(raw))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            calls = []
        if not calls:
            return [TextChunk(task_id=task_id, text=f"{self.open_tag}{raw}{self.close_tag}")]
        return [ToolCallChunk(task_id=task_id, call=call) for call in calls]

    def _unclosed(self, task_id: TaskId, text: str) -> list[Chunk]:
        if not self.close_tag:  # an open-ended block ends with the stream
            return self._block(task_id, text, closed=True)
        # A call cut off (max_tokens, a stop) is not a call: give back what was said.
        raw, self._call = self._call + text, ""
        return [TextChunk(task_id=task_id, text=f"{self.open_tag}{raw}")]


def tool_call(name: object, arguments: object, call_id: object = None) -> ToolCall:
    """A `ToolCall` from a parsed name and arguments (an object or a JSON string)."""
    if not isinstance(name, str) or not name:
        raise ToolCallParseError("a tool call needs a name")
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    ident = call_id if isinstance(call_id, str) and call_id else new_id("call")
    return ToolCall(id=ident, name=name, arguments=args)


def read_hermes(text: str) -> list[ToolCall]:
    """`{"name": ..., "arguments": {...}}` (hermes, Qwen2.5/3, and most JSON tool formats)."""
    data = json.loads(text.strip())
    if not isinstance(data, dict):
        raise ToolCallParseError("a tool call is a JSON object")
    return [tool_call(data["name"], data.get("arguments", data.get("parameters", {})))]
