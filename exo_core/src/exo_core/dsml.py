# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are fullwidth characters by design)
"""DeepSeek's DSML tool calls (V3.2 and V4), read whole and streamed.

A DSML block holds one `invoke` per call, each parameter in its own tag::

    <｜DSML｜tool_calls>                       (V3.2: <｜DSML｜function_calls>)
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

`string="true"` values are the text as it is; `string="false"` values are JSON (numbers,
booleans, arrays, objects), kept as text when they are not.
"""

from __future__ import annotations

import json
import re
from typing import Any

from exo_core.generation import ToolCall
from exo_core.parsers import (
    CallFragment,
    ToolBlockParser,
    ToolCallParseError,
    split_held,
    tool_call,
)
from exo_core.tool_arguments import dumps_json

DSML = "｜DSML｜"
V32_BLOCK = (f"<{DSML}function_calls>", f"</{DSML}function_calls>")
"""The opening and closing markers of a DeepSeek V3.2 tool-call block."""
V4_BLOCK = (f"<{DSML}tool_calls>", f"</{DSML}tool_calls>")
"""The opening and closing markers of a DeepSeek V4 tool-call block."""
_INVOKE = re.compile(rf'<{DSML}invoke\s+name="([^"]*)"\s*>')
_PARAM = re.compile(rf'<{DSML}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>')
_PARAM_END = f"</{DSML}parameter>"
_INVOKE_END = f"</{DSML}invoke>"
_WHOLE_INVOKE = re.compile(rf'<{DSML}invoke\s+name="([^"]+)"\s*>(.*?){_INVOKE_END}', re.DOTALL)
_WHOLE_PARAM = re.compile(rf"{_PARAM.pattern}(.*?){_PARAM_END}", re.DOTALL)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def read_dsml(text: str) -> list[ToolCall]:
    """Every `invoke` of a DSML block (the text between its tags) as a call."""
    calls: list[ToolCall] = []
    for name, body in _WHOLE_INVOKE.findall(text):
        arguments = {
            key: value if is_string == "true" else _json_or_text(value)
            for key, is_string, value in _WHOLE_PARAM.findall(body)
        }
        calls.append(tool_call(name, arguments))
    if not calls:
        raise ToolCallParseError("no DSML invoke in the block")
    return calls


class DsmlCallStream:
    """A DSML block streamed: a call starts at its `invoke` tag, each parameter goes out as
    a JSON member (a string parameter as it is written), and `</invoke>` closes it."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "between"  # between calls, "invoke", or inside a "string"/"json" value
        self._calls = 0
        self._name = ""
        self._members = 0
        self._searched = 0  # how far a JSON value's text was searched for its end tag

    def _out(self, text: str) -> CallFragment:
        return (self._calls - 1, self._name, text)

    def feed(self, text: str) -> list[CallFragment]:
        self._buffer += text
        out: list[CallFragment] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[CallFragment]) -> bool:
        buffer = self._buffer
        if self._state == "between":
            match = _INVOKE.search(buffer)
            if match is None:
                self._buffer = buffer[buffer.rfind("<") :] if "<" in buffer else ""
                return False
            self._calls += 1
            self._name, self._members, self._state = match.group(1), 0, "invoke"
            self._buffer = buffer[match.end() :]
            out.append(self._out("{"))
            return True
        if self._state == "invoke":
            match = _PARAM.search(buffer)
            end = buffer.find(_INVOKE_END)
            if end >= 0 and (match is None or end < match.start()):
                out.append(self._out("}"))
                self._state, self._buffer = "between", buffer[end + len(_INVOKE_END) :]
                return True
            if match is None:
                self._buffer = buffer[buffer.rfind("<") :] if "<" in buffer else ""
                return False
            sep = ", " if self._members else ""
            self._members += 1
            string = match.group(2) == "true"
            quote = '"' if string else ""
            out.append(self._out(f"{sep}{dumps_json(match.group(1))}: {quote}"))
            self._state = "string" if string else "json"
            self._buffer = buffer[match.end() :]
            return True
        at = buffer.find(_PARAM_END, self._searched)
        if self._state == "string":
            safe, held = (buffer[:at], "") if at >= 0 else split_held(buffer, _PARAM_END)
            closing = '"' if at >= 0 else ""
            if safe or closing:
                out.append(self._out(dumps_json(safe)[1:-1] + closing))
            self._buffer = buffer[at + len(_PARAM_END) :] if at >= 0 else held
        elif at >= 0:  # a JSON value goes out whole
            out.append(self._out(dumps_json(_json_or_text(buffer[:at]))))
            self._buffer = buffer[at + len(_PARAM_END) :]
        else:  # a JSON value still being written: look on from where this search ended
            self._searched = max(0, len(buffer) - len(_PARAM_END) + 1)
            return False
        if at < 0:
            return False
        self._state, self._searched = "invoke", 0
        return True

    def finish(self) -> list[CallFragment]:
        """The block closed: a call left open is closed with what it has."""
        state, buffer = self._state, self._buffer
        self._state, self._buffer, self._searched = "between", "", 0
        if state == "string":
            return [self._out(dumps_json(buffer)[1:-1] + '"}')]
        if state == "json":
            value = dumps_json(_json_or_text(buffer)) if buffer.strip() else "null"
            return [self._out(value + "}")]
        return [self._out("}")] if state == "invoke" else []


class DsmlToolParser(ToolBlockParser):
    """A DSML block (V3.2's or V4's tags) becomes tool calls, streamed as they are written."""

    def __init__(self, block: tuple[str, str] = V4_BLOCK) -> None:
        super().__init__(block[0], block[1], read_dsml, DsmlCallStream)
