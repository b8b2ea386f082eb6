"""A tool call's arguments, coerced to the tool's schema while the model is still writing them.

`ArgumentStream` reads the arguments' JSON text in fragments, as the model produces it, and
writes the coerced JSON text out in fragments: a member of the arguments object goes out as
soon as its value is complete (coerced to its property's schema), and a string value whose
schema keeps strings as they are goes out character by character as it is written. So a
client sees a long string argument (a file's contents) grow, while `"5"` for an integer
property waits for its closing quote and goes out as 5. What went out is never taken back:
the fragments joined are exactly `ArgumentStream.text`, the coerced arguments.

The output is always one JSON object (unless the model wrote no object at all, which is kept
as written): whitespace is normalised, a member repeated keeps its first value, a value that
is not JSON becomes a string of what the model wrote, and an object cut off is closed.
Arguments that are not an object at the top (a string holding the JSON, say) are read whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from exo_core.generation import Chunk, ToolCallChunk, ToolCallDeltaChunk, ToolSpec
from exo_core.tool_schema import coerce_value, keeps_strings, member_schema, plain_object

_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING_END = re.compile(r'["\\]')
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def dumps_json(value: Any) -> str:
    """JSON text for `value`, unicode kept as it is; a lone surrogate (from a `\\ud83d` the
    model never finished) becomes U+FFFD, so the text always encodes as UTF-8."""
    return _SURROGATE.sub("\ufffd", json.dumps(value, ensure_ascii=False))


def schemas(tools: Sequence[ToolSpec]) -> dict[str, dict[str, Any]]:
    """Each offered tool's parameter schema, by name."""
    return {tool.name: tool.parameters for tool in tools}


class ArgumentStream:
    """Raw argument fragments in, coerced JSON fragments out (see the module's docstring)."""

    def __init__(self, schema: Any = None) -> None:
        self._schema = schema if schema is not None else {}
        self._raw = ""  # read but not yet used
        self._state = "start"
        self._out: list[str] = []
        self._members = 0
        self._seen: set[str] = set()
        self._key = ""
        self._skip = False  # the value being read belongs to a repeated key
        self._value: list[str] = []  # the raw text of a value read whole, in pieces
        self._depth = 0
        self._quoted = False
        self._escaped = False

    @property
    def text(self) -> str:
        """Everything written out so far."""
        return "".join(self._out)

    @property
    def done(self) -> bool:
        """Whether the arguments object is closed (what follows is not read)."""
        return self._state == "done"

    def feed(self, raw: str) -> str:
        """Read the next fragment; returns the coerced text that is now certain."""
        self._raw += raw
        start = len(self._out)
        while self._raw and self._step():
            pass
        return "".join(self._out[start:])

    def finish(self) -> str:
        """The arguments ended: returns the rest, closing what was left open."""
        start = len(self._out)
        self.feed("")
        state = self._state
        if state in ("start", "whole"):
            self._out.append(self._whole("".join(self._value) + self._raw))
        elif state == "string":
            self._out.append('"}')
        elif state == "value" and "".join(self._value).strip():
            self._member("".join(self._value))
            self._out.append("}")
        elif state != "done":
            self._out.append("}")
        self._state, self._raw = "done", ""
        return "".join(self._out[start:])

    # -- the states: each consumes what it can and says whether to go on ----------------------

    def _step(self) -> bool:
        if self._state == "done":
            self._raw = ""
            return False
        if self._state == "whole":
            self._value.append(self._raw)
            self._raw = ""
            return False
        if self._state == "string":
            return self._string()
        if self._state == "value":
            return self._read_value()
        self._raw = self._raw.lstrip()
        if not self._raw:
            return False
        if self._state == "start":
            return self._on_start()
        if self._state == "key":
            return self._on_key()
        return self._on_colon() if self._state == "colon" else self._on_after()

    def _on_start(self) -> bool:
        if self._raw[0] == "{" and plain_object(self._schema):
            self._raw = self._raw[1:]
            self._out.append("{")
            self._state = "key"
        else:
            self._state = "whole"
        return True

    def _on_key(self) -> bool:
        first = self._raw[0]
        if first == ",":
            self._raw = self._raw[1:]
            return True
        if first == "}":
            return self._close()
        if first != '"':
            return self._close()  # not JSON: what was read is kept, the rest is not
        match = _KEY.match(self._raw)
        if match is None:
            return False  # the key is not complete yet
        self._raw = self._raw[match.end() :]
        try:
            self._key = json.loads(match.group(0), strict=False)
        except ValueError:
            self._key = match.group(1)
        self._skip = self._key in self._seen
        self._seen.add(self._key)
        self._state = "colon"
        return True

    def _on_colon(self) -> bool:
        if self._raw[0] != ":":
            return self._close()
        self._raw = self._raw[1:]
        self._state = "value"
        return True

    def _on_after(self) -> bool:
        first = self._raw[0]
        if first == ",":
            self._raw = self._raw[1:]
            self._state = "key"
            return True
        return self._close()

    def _close(self) -> bool:
        self._out.append("}")
        self._state, self._raw = "done", ""
        return False

    # -- values ------------------------------------------------------------------------------

    def _schema_of(self, key: str) -> Any:
        """A member's schema; its `$ref`s point into the tool's whole schema."""
        return member_schema(self._schema, key)

    def _open_member(self) -> str:
        sep = ", " if self._members else ""
        self._members += 1
        return f"{sep}{dumps_json(self._key)}: "

    def _member(self, raw: str) -> None:
        """A value read whole: parsed, coerced and written (unless its key is repeated)."""
        if self._skip:
            return
        try:
            value: Any = json.loads(raw, strict=False)
        except ValueError:
            value = raw.strip()  # not JSON: kept as the text the model wrote
        self._out.append(
            self._open_member()
            + dumps_json(coerce_value(value, self._schema_of(self._key), self._schema))
        )

    def _read_value(self) -> bool:
        """Reads a value's raw text until it is complete (strings, nesting and scalars)."""
        raw = self._raw
        if not self._value:
            raw = raw.lstrip()
            if not raw:
                self._raw = ""
                return False
            if (
                raw[0] == '"'
                and not self._skip
                and keeps_strings(self._schema_of(self._key), self._schema)
            ):
                self._out.append(self._open_member() + '"')
                self._raw, self._state = raw[1:], "string"
                return True
        for i, char in enumerate(raw):
            if self._quoted:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._quoted = False
                    if self._depth == 0:
                        return self._ended(raw, i + 1)
                continue
            if char == '"':
                self._quoted = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                if self._depth == 0:  # the end of the arguments object after a scalar
                    return self._ended(raw, i)
                self._depth -= 1
                if self._depth == 0:
                    return self._ended(raw, i + 1)
            elif char == "," and self._depth == 0:
                return self._ended(raw, i)
        self._value.append(raw)
        self._raw = ""
        return False

    def _ended(self, raw: str, at: int) -> bool:
        self._member("".join(self._value) + raw[:at])
        self._value, self._raw, self._state = [], raw[at:], "after"
        return True

    def _string(self) -> bool:
        """A string value streamed as it is written: decoded, then encoded again as JSON."""
        raw = self._raw
        match = _STRING_END.search(raw)
        end = match.start() if match else len(raw)
        if end:
            self._out.append(dumps_json(raw[:end])[1:-1])
        raw = raw[end:]
        if not raw:
            self._raw = ""
            return False
        if raw[0] == '"':
            self._out.append('"')
            self._raw, self._state = raw[1:], "after"
            return True
        decoded, used = _escape(raw)
        if used == 0:  # an escape not complete yet
            self._raw = raw
            return False
        self._out.append(dumps_json(decoded)[1:-1])
        self._raw = raw[used:]
        return True

    def _whole(self, raw: str) -> str:
        """Arguments read at once: not an object at the top, or under a schema that is."""
        try:
            value = json.loads(raw, strict=False) if raw.strip() else {}
        except ValueError:
            return raw  # not JSON at all: kept as the model wrote it
        if isinstance(value, str):  # the object written as a string of JSON
            try:
                value = json.loads(value, strict=False)
            except ValueError:
                return raw
        coerced = coerce_value(value, self._schema)
        return dumps_json(coerced) if isinstance(coerced, dict) else raw


def _escape(raw: str) -> tuple[str, int]:
    """The character a backslash escape at the start of `raw` stands for, and its length; 0
    when the escape is not complete yet. A `\\uD83D\\uDE00` pair is read as one character."""
    if len(raw) < 2:
        return "", 0
    kind = raw[1]
    if kind != "u":
        return _ESCAPES.get(kind, kind), 2
    if len(raw) < 6:
        return "", 0
    try:
        code = int(raw[2:6], 16)
    except ValueError:
        return raw[:6], 6  # not an escape: kept as written
    if 0xD800 <= code < 0xDC00:
        if len(raw) < 12 and "\\u".startswith(raw[6:8]):
            return "", 0  # its low half may follow
        if raw[6:8] == "\\u":
            try:
                low = int(raw[8:12], 16)
            except ValueError:
                low = 0
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
    return chr(code), 6


def coerce_arguments(arguments: str, schema: Any) -> str:
    """A whole call's arguments text, coerced (the same as streaming it in one fragment)."""
    stream = ArgumentStream(schema)
    return stream.feed(arguments) + stream.finish()


class CallCoercion:
    """One generation's tool calls coerced to the schemas of the tools its request offered.

    Deltas go through an `ArgumentStream` per call, so what a client is streamed is already
    coerced; the whole call (`ToolCallChunk`) then carries exactly the deltas joined. A call
    that came whole is coerced whole. A tool the request did not offer is only normalised."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._schemas = schemas(tools)
        self._streams: dict[str, ArgumentStream] = {}

    def feed(self, chunk: Chunk) -> list[Chunk]:
        """The chunks to pass on for `chunk` (tool calls coerced; any other chunk as it is)."""
        if isinstance(chunk, ToolCallDeltaChunk):
            stream = self._streams.get(chunk.id)
            first = stream is None
            if stream is None:
                stream = self._streams[chunk.id] = ArgumentStream(self._schemas.get(chunk.name))
            text = stream.feed(chunk.arguments)
            return [msgspec.structs.replace(chunk, arguments=text)] if first or text else []
        if isinstance(chunk, ToolCallChunk):
            call = chunk.call
            stream = self._streams.pop(call.id, None)
            if stream is None:
                arguments = coerce_arguments(call.arguments, self._schemas.get(call.name))
                return [_with_arguments(chunk, arguments)]
            rest = stream.finish()
            last: list[Chunk] = []
            if rest:
                last.append(
                    ToolCallDeltaChunk(
                        task_id=chunk.task_id, id=call.id, name=call.name, arguments=rest
                    )
                )
            return [*last, _with_arguments(chunk, stream.text)]
        return [chunk]


def _with_arguments(chunk: ToolCallChunk, arguments: str) -> ToolCallChunk:
    return msgspec.structs.replace(
        chunk, call=msgspec.structs.replace(chunk.call, arguments=arguments)
    )
