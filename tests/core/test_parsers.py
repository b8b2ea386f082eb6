"""The output parsers the core ships: thinking blocks and Hermes tool calls, streamed."""

from __future__ import annotations

import json

import pytest

from exo_core.builtin.output_parsers import HermesToolParser
from exo_core.generation import Chunk, TextChunk, ThinkingChunk, ToolCallChunk
from exo_core.ids import TaskId
from exo_core.parsers import ChainedParser, OutputParser, ThinkParser, thinking_switch

T = TaskId("t")


def feed(parser: OutputParser, pieces: list[str]) -> list[Chunk]:
    out: list[Chunk] = []
    for piece in pieces:
        out.extend(parser.feed(TextChunk(task_id=T, text=piece)))
    out.extend(parser.finish(T))
    return out


def texts(chunks: list[Chunk], kind: type) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))  # type: ignore[attr-defined]


def split_everywhere(text: str) -> list[list[str]]:
    """The text cut into two pieces at every position (tags split across tokens)."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


@pytest.mark.parametrize("pieces", split_everywhere("<think>why not</think>Because."))
def test_think_blocks_are_separated_wherever_the_tags_split(pieces: list[str]) -> None:
    out = feed(ThinkParser(), pieces)
    assert texts(out, ThinkingChunk) == "why not"
    assert texts(out, TextChunk) == "Because."


def test_text_that_only_looks_like_a_tag_is_kept() -> None:
    out = feed(ThinkParser(), ["a <thin", "g> b < c"])
    assert texts(out, TextChunk) == "a <thing> b < c"


def test_an_unclosed_think_block_is_thinking() -> None:
    out = feed(ThinkParser(), ["<think>still going"])
    assert texts(out, ThinkingChunk) == "still going" and texts(out, TextChunk) == ""


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.mark.parametrize("pieces", split_everywhere(f"Let me check. {CALL}"))
def test_hermes_tool_calls_wherever_the_tags_split(pieces: list[str]) -> None:
    out = feed(HermesToolParser(), pieces)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert len(calls) == 1
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert texts(out, TextChunk) == "Let me check. "


def test_a_malformed_tool_call_comes_out_as_text() -> None:
    bad = "<tool_call>{not json}</tool_call>"
    out = feed(HermesToolParser(), [bad])
    assert not any(isinstance(c, ToolCallChunk) for c in out)
    assert texts(out, TextChunk) == bad


def test_two_calls_and_thinking_chained() -> None:
    parser = ChainedParser([ThinkParser(), HermesToolParser()])
    out = feed(parser, ["<think>plan</think>", CALL, CALL.replace("Paris", "Rome")])
    assert texts(out, ThinkingChunk) == "plan"
    cities = [json.loads(c.call.arguments)["city"] for c in out if isinstance(c, ToolCallChunk)]
    assert cities == ["Paris", "Rome"]
    ids = {c.call.id for c in out if isinstance(c, ToolCallChunk)}
    assert len(ids) == 2


@pytest.mark.parametrize(
    ("template", "switch"),
    [
        ("{%- if enable_thinking is false %}<think>\n\n</think>{% endif %}", "enable_thinking"),
        # DeepSeek V3.1's shape: a bare `thinking`, defaulted when not given.
        ("{% if not thinking is defined %}{% set thinking = false %}{% endif %}", "thinking"),
        ("{{ '<think>' if thinking else '</think>' }}", "thinking"),
        ("{% if thinking %}{% endif %}{% if enable_thinking %}{% endif %}", "enable_thinking"),
        # Not the variable: a message's field, a string, a comment, the text around the tags.
        ("{{ m.thinking }}{{ m['thinking'] }}{# thinking #} thinking {{ messages }}", None),
        ("{% set thinking_budget = 3 %}", None),
        ("", None),
    ],
)
def test_a_chat_templates_thinking_switch_is_read_from_its_tags(
    template: str, switch: str | None
) -> None:
    assert thinking_switch(template) == switch
