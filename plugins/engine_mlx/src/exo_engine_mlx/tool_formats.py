# ruff: noqa: RUF001, RUF002, RUF003  (DeepSeek's markers are fullwidth characters by design)
"""Tool-call formats of families that mlx-lm's tool parsers do not cover.

mlx-lm reads most families' tool calls (see `output.py`); DeepSeek's formats and
Nemotron-H's `<TOOLCALL>` list are read here, in the same shape as mlx-lm's parsers
(`parse(text, tools)` -> dicts), and found the same way: by the markers the tokenizer's chat
template or vocabulary carries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exo_core.plugin.parsers import (
    V4_BLOCK,
    V32_BLOCK,
    ArgumentStream,
    CallFragment,
    CallStream,
    DsmlCallStream,
    read_dsml,
    split_held,
)

Parse = Callable[[str, Any], Any]
"""`parse_tool_call(text, tools)` as mlx-lm's parsers have it: a dict (name, arguments, maybe an
id) or a list of them; raises when the text is not a call."""


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str
    end: str
    parse: Parse
    # Reads a block as it streams, so calls reach clients as argument deltas (None: whole).
    stream: Callable[[], CallStream] | None = None


# DeepSeek V3.2 and V4 "DSML" (the core reads and streams it: `exo_core.dsml`).
def parse_dsml(text: str, tools: Any = None) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": json.loads(c.arguments)} for c in read_dsml(text)]


# DeepSeek V3 / V3.1 / R1: <｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}<｜tool▁call▁end｜>
# (V3.0 prefixes the name with "function" and fences the JSON; both are accepted).
_V31_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*(?:function\s*<｜tool▁sep｜>)?\s*([^<\s]+?)\s*"
    r"(?:<｜tool▁sep｜>)?\s*(?:```json\s*)?(\{.*?\})\s*(?:```\s*)?<｜tool▁call▁end｜>",
    re.DOTALL,
)


def parse_deepseek_v3(text: str, tools: Any = None) -> list[dict[str, Any]]:
    calls = [
        {"name": name, "arguments": json.loads(args)} for name, args in _V31_CALL.findall(text)
    ]
    if not calls:
        raise ValueError("no DeepSeek tool call in the block")
    return calls


_V3_BEGIN, _V3_SEP, _V3_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_FENCE = re.compile(r"```(?:json)?")


def _v3_name(head: str) -> str:
    """The name before a call's JSON: `name<｜tool▁sep｜>` (V3.1) or V3.0's
    `function<｜tool▁sep｜>name` and its ```json fence."""
    parts = [p.strip() for p in _FENCE.sub("", head).split(_V3_SEP) if p.strip()]
    if len(parts) > 1 and parts[0] == "function":
        parts = parts[1:]
    return parts[0] if parts else ""


class DeepSeekV3CallStream:
    """DeepSeek V3/V3.1's calls streamed: a call starts once its name and the `{` of its JSON
    are read, and its arguments go out as written, up to `<｜tool▁call▁end｜>`."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "between"  # before a call, in its "head" (the name), or its "args"
        self._calls = 0
        self._name = ""
        self._args = ArgumentStream()

    def feed(self, text: str) -> list[CallFragment]:
        self._buffer += text
        out: list[CallFragment] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[CallFragment]) -> bool:
        buffer = self._buffer
        if self._state == "between":
            at = buffer.find(_V3_BEGIN)
            if at < 0:
                self._buffer = split_held(buffer, _V3_BEGIN)[1]
                return False
            self._buffer, self._state = buffer[at + len(_V3_BEGIN) :], "head"
            return True
        if self._state == "head":
            at = buffer.find("{")
            if at < 0:
                return False
            self._name, self._buffer = _v3_name(buffer[:at]), buffer[at:]
            if not self._name:  # no name: not a call this stream can send
                self._state = "between"
                return True
            self._calls += 1
            self._args, self._state = ArgumentStream(), "args"
            out.append((self._calls - 1, self._name, ""))
            return True
        at = buffer.find(_V3_END)
        safe, held = (buffer[:at], "") if at >= 0 else split_held(buffer, _V3_END)
        piece = self._args.feed(safe)
        if at >= 0:
            piece += self._args.finish()
        if piece:
            out.append((self._calls - 1, self._name, piece))
        if at < 0:
            self._buffer = held
            return False
        self._buffer, self._state = buffer[at + len(_V3_END) :], "between"
        return True

    def finish(self) -> list[CallFragment]:
        if self._state != "args":
            return []
        self._state = "between"
        piece = self._args.feed(self._buffer) + self._args.finish()
        self._buffer = ""
        return [(self._calls - 1, self._name, piece)] if piece else []


# Nemotron-H (Nemotron Nano 9B v2): <TOOLCALL>[{"name": "f", "arguments": {...}}, ...]</TOOLCALL>,
# every call of the turn in one JSON list.
def parse_toolcall_list(text: str, tools: Any = None) -> list[dict[str, Any]]:
    data = json.loads(text)
    calls = [data] if isinstance(data, dict) else data  # a lone object: one call
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) for c in calls):
        raise ValueError("a <TOOLCALL> block holds a JSON list of calls")
    return [{"name": c.get("name"), "arguments": c.get("arguments", {})} for c in calls]


FORMATS = (
    ToolFormat("deepseek_v4", *V4_BLOCK, parse_dsml, DsmlCallStream),
    ToolFormat("deepseek_v32", *V32_BLOCK, parse_dsml, DsmlCallStream),
    ToolFormat(
        "deepseek_v3",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        parse_deepseek_v3,
        DeepSeekV3CallStream,
    ),
    ToolFormat("nemotron_toolcall", "<TOOLCALL>", "</TOOLCALL>", parse_toolcall_list),
)


def find_format(tokenizer: Any) -> ToolFormat | None:
    """The format whose start marker the tokenizer's chat template or vocabulary holds."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    try:
        vocab: Any = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary view
        vocab = {}
    for candidate in FORMATS:
        if candidate.start in template or candidate.start in vocab:
            return candidate
    return None
