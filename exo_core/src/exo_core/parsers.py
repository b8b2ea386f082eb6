"""Output parsers turn a model's raw text stream into text, thinking and tool-call chunks.

A model card names its parsers (`reasoning_parser`, `tool_parser`); plugins register parser
factories by name through the `exo_output_parsers` hook. An engine that knows its model's
output format (its tokenizer names the think and tool-call markers) may parse on its own side
with the same classes, so its chunks reach the dialects already structured.

Every parser here is streaming: text that might be the start of a tag is held back until it
is decided, so a tag split across tokens is still found. A tool-call parser given a
`CallStream` (Hermes JSON here, DeepSeek's DSML in `exo_core.dsml`) also sends each call's
arguments as `ToolCallDeltaChunk`s while the model writes them.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from exo_core.generation import (
    Chunk,
    GenerationParams,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
)
from exo_core.ids import TaskId, new_id
from exo_core.model_cards import ModelCard
from exo_core.tool_arguments import ArgumentStream

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
"""Builds an output parser for one generation from the model card and the generation's
parameters; register factories with the `exo_output_parsers` hook."""


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


CallFragment = tuple[int, str, str]
"""(the call's number within its block, its name, the next fragment of its arguments' JSON)."""


class CallStream(Protocol):
    """Reads one tool-call block as it streams, so a call's arguments reach clients as the
    model writes them. Fragments of one call joined are its arguments' JSON text."""

    def feed(self, text: str) -> list[CallFragment]:
        """The next text of the block; returns the fragments that are now certain."""
        ...

    def finish(self) -> list[CallFragment]:
        """The block closed: returns what is left, every call's arguments closed."""
        ...


class ToolBlockParser(TaggedBlockParser):
    """A tool-call block between `open_tag` and `close_tag` becomes tool call chunks.

    With a `stream` (a `CallStream` factory), each call also comes out as
    `ToolCallDeltaChunk`s while its block is still being written, and the block's calls are
    the ones streamed; without one (or when the stream found no call), the whole block is
    read by `read` once it closes. A block that the reader refuses comes out as plain text, so
    nothing the model said is lost; so does a block cut off before its end (its deltas, if
    any went out, were a preview)."""

    def __init__(
        self,
        open_tag: str,
        close_tag: str,
        read: ToolBlockReader,
        stream: Callable[[], CallStream] | None = None,
    ) -> None:
        super().__init__(open_tag, close_tag)
        self._read = read
        self._streams = stream
        self._call = ""
        self._reset()

    def _reset(self) -> None:
        self._stream = self._streams() if self._streams is not None else None
        # The calls streamed from this block, by number: (id, name, argument fragments).
        self._streamed: dict[int, tuple[str, str, list[str]]] = {}

    def _deltas(self, task_id: TaskId, fragments: list[CallFragment]) -> list[Chunk]:
        out: list[Chunk] = []
        for number, name, text in fragments:
            call_id, _, parts = self._streamed.setdefault(number, (new_id("call"), name, []))
            parts.append(text)
            out.append(ToolCallDeltaChunk(task_id=task_id, id=call_id, name=name, arguments=text))
        return out

    def _block(self, task_id: TaskId, text: str, closed: bool) -> list[Chunk]:
        self._call += text
        out: list[Chunk] = []
        if self._stream is not None:
            out = self._deltas(task_id, self._stream.feed(text))
            if closed:
                out += self._deltas(task_id, self._stream.finish())
        if not closed:
            return out
        raw, self._call = self._call, ""
        streamed = [
            ToolCall(id=call_id, name=name, arguments="".join(parts))
            for call_id, name, parts in (self._streamed[n] for n in sorted(self._streamed))
        ]
        self._reset()
        if streamed:
            return [*out, *(ToolCallChunk(task_id=task_id, call=call) for call in streamed)]
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
        self._reset()
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


_HERMES_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:', re.DOTALL
)


_HEAD_LIMIT = 4096  # a name and the text before the arguments are never longer


class HermesCallStream:
    """A `{"name": ..., "arguments": ...}` block streamed: the call starts once its name is
    read, then its arguments go out as written. Another layout (the arguments first, a list of
    calls) is not streamed; the block is then read whole when it closes."""

    def __init__(self) -> None:
        self._head = ""
        self._name: str | None = None
        self._args = ArgumentStream()

    def feed(self, text: str) -> list[CallFragment]:
        if self._name is not None:
            return self._fragment(self._args.feed(text) if not self._args.done else "")
        if len(self._head) > _HEAD_LIMIT:
            return []  # not the layout that streams: the block is read whole at its end
        self._head += text
        match = _HERMES_HEAD.match(self._head)
        if match is None:
            return []
        try:
            name = json.loads(match.group(1))
        except ValueError:
            name = ""
        if not isinstance(name, str) or not name:
            self._head = "-" * (_HEAD_LIMIT + 1)  # not a call: read whole at the end
            return []
        self._name = name
        return [(0, name, ""), *self._fragment(self._args.feed(self._head[match.end() :]))]

    def _fragment(self, text: str) -> list[CallFragment]:
        return [(0, self._name, text)] if text and self._name is not None else []

    def finish(self) -> list[CallFragment]:
        return self._fragment(self._args.finish()) if self._name is not None else []
