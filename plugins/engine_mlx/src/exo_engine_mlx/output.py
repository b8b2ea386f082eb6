"""The model family's own output format, read from its tokenizer.

mlx-lm's tokenizer wrapper knows each family's think markers (`<think>`, `<longcat_think>`,
Gemma's `<|channel>thought`, ...) and its tool-call format (`tool_parsers/`: JSON, Qwen3-Coder
XML, GLM, Kimi K2, MiniMax, Mistral, pythonic, ...); DeepSeek's and Nemotron-H's formats,
which it lacks, are in `tool_formats.py`, gpt-oss's Harmony channels in `harmony.py`. The
runner parses with them on its own side, so the dialects receive thinking and tool-call
chunks for every family whose tokenizer names its format.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exo_core.plugin import GenerationParams, ToolCall
from exo_core.plugin.parsers import (
    ChainedParser,
    HermesCallStream,
    OutputParser,
    ThinkParser,
    ToolBlockParser,
    ToolCallParseError,
    tool_call,
)
from exo_engine_mlx.harmony_encoding import is_harmony
from exo_engine_mlx.prompt import template_tools
from exo_engine_mlx.tool_formats import ToolFormat, find_format


def opens_thinking(prompt: str, think_start: str, think_end: str) -> bool:
    """Whether the rendered prompt ends inside a think block (templates of reasoning models
    often open it for the model), so the model's first words are thinking."""
    at = prompt.rfind(think_start)
    if at < 0:
        return False
    rest = prompt[at + len(think_start) :]
    return think_end not in rest and not rest.strip()


def tool_reader(
    parse: Callable[[str, Any], Any], tools: list[dict[str, Any]]
) -> Callable[[str], list[ToolCall]]:
    """Adapts an mlx-lm tool parser to the core's block reader."""

    def read(text: str) -> list[ToolCall]:
        try:
            parsed = parse(text, tools or None)
        except Exception as e:  # the family's parser refusing the text: shown as text
            raise ToolCallParseError(str(e)) from e
        items: Sequence[Any] = parsed if isinstance(parsed, list) else [parsed]
        calls: list[ToolCall] = []
        for item in items:
            if not isinstance(item, dict):
                raise ToolCallParseError("a tool call is an object")
            calls.append(tool_call(item.get("name"), item.get("arguments", {}), item.get("id")))
        return calls

    return read


def tool_format(tokenizer: Any) -> ToolFormat | None:
    """The family's tool-call format: mlx-lm's parser when it found one, else ours."""
    parse = getattr(tokenizer, "tool_parser", None)
    start = getattr(tokenizer, "tool_call_start", None)
    if parse is not None and isinstance(start, str) and start:
        name = str(getattr(parse, "__module__", "")).rsplit(".", 1)[-1]
        end = getattr(tokenizer, "tool_call_end", None) or ""
        # Hermes JSON is streamed as it is written; mlx-lm's other formats are read whole.
        stream = HermesCallStream if name == "json_tools" else None
        return ToolFormat(name, start, end, parse, stream)
    return find_format(tokenizer)


@dataclass(frozen=True)
class _Family:
    harmony: bool
    tools: ToolFormat | None


_FAMILIES: weakref.WeakKeyDictionary[Any, _Family] = weakref.WeakKeyDictionary()


def _family(tokenizer: Any) -> _Family:
    """What the tokenizer says about its family's output format, read once per tokenizer: its
    vocabulary view is rebuilt on every call (~0.1-0.3 s for SmolLM2's 49k tokens on a busy
    CPU), which every request used to pay twice before its prefill."""
    try:
        return _FAMILIES[tokenizer]
    except KeyError:
        pass
    except TypeError:  # neither hashable nor weakly referable: read it each time
        return _Family(is_harmony(tokenizer), tool_format(tokenizer))
    family = _Family(is_harmony(tokenizer), tool_format(tokenizer))
    _FAMILIES[tokenizer] = family
    return family


def family_parser(tokenizer: Any, params: GenerationParams, prompt: str) -> OutputParser | None:
    """The parser for one sequence: the family's thinking, then its tool calls (only when the
    request offered tools, so a model's literal tags are otherwise left as text)."""
    family = _family(tokenizer)
    if family.harmony:  # gpt-oss: channels carry both thinking and calls
        from exo_engine_mlx.harmony import HarmonyParser  # openai-harmony: ~1 s import

        return HarmonyParser(bool(template_tools(params)), prompt)
    parsers: list[OutputParser] = []
    start = getattr(tokenizer, "think_start", None)
    end = getattr(tokenizer, "think_end", None)
    if isinstance(start, str) and isinstance(end, str) and start and end:
        parsers.append(ThinkParser(start, end, inside=opens_thinking(prompt, start, end)))
    tools = template_tools(params)
    found = family.tools
    if tools and found is not None:
        read = tool_reader(found.parse, tools)
        parsers.append(ToolBlockParser(found.start, found.end, read, found.stream))
    if not parsers:
        return None
    return parsers[0] if len(parsers) == 1 else ChainedParser(parsers)
