# ruff: noqa: RUF001, RUF003  (DeepSeek's markers are fullwidth characters by design)
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

from exo_core.plugin import V4_BLOCK, V32_BLOCK, CallStream, DsmlCallStream, read_dsml

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
    ToolFormat("deepseek_v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", parse_deepseek_v3),
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
