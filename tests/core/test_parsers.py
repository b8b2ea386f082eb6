"""The output parsers the core ships: thinking blocks, Hermes and DSML tool calls, streamed."""

from __future__ import annotations

import json

import pytest

from exo_core.builtin import output_parsers
from exo_core.builtin.output_parsers import HermesToolParser
from exo_core.dsml import DSML, V4_BLOCK, V32_BLOCK, DsmlToolParser, read_dsml
from exo_core.generation import (
    Chunk,
    GenerationParams,
    TextChunk,
    ThinkingChunk,
    ToolCallChunk,
    ToolCallDeltaChunk,
)
from exo_core.ids import ModelId, TaskId
from exo_core.model_cards import ModelCard
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


def deltas(chunks: list[Chunk]) -> dict[str, str]:
    """Each streamed call's arguments, its deltas joined, by call id."""
    joined: dict[str, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDeltaChunk):
            joined[chunk.id] = joined.get(chunk.id, "") + chunk.arguments
    return joined


LONG = '<tool_call>\n{"name": "write", "arguments": {"path": "a.txt", "body": "one two three"}}\n</tool_call>'


def test_hermes_arguments_stream_as_the_model_writes_them() -> None:
    out = feed(HermesToolParser(), [LONG[i : i + 3] for i in range(0, len(LONG), 3)])
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert len(calls) == 1 and calls[0].name == "write"
    assert deltas(out) == {calls[0].id: calls[0].arguments}
    assert json.loads(calls[0].arguments) == {"path": "a.txt", "body": "one two three"}
    # The body's words went out before the block closed, in several deltas.
    pieces = [c for c in out if isinstance(c, ToolCallDeltaChunk) and c.arguments]
    assert len(pieces) > 5 and out.index(pieces[-1]) < out.index(
        next(c for c in out if isinstance(c, ToolCallChunk))
    )


def test_a_hermes_block_in_another_layout_is_read_whole() -> None:
    other = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'
    out = feed(HermesToolParser(), [other])
    assert not deltas(out)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_a_cut_off_streamed_call_is_text() -> None:
    cut = LONG[: LONG.index("three")]
    out = feed(HermesToolParser(), [cut])
    assert deltas(out)  # its deltas went out as the model wrote them (a preview) ...
    assert not any(isinstance(c, ToolCallChunk) for c in out)  # ... but it is no call
    assert texts(out, TextChunk) == cut


V4 = (
    f"Let me look.<{DSML}tool_calls>\n"
    f'<{DSML}invoke name="get_weather">\n'
    f'<{DSML}parameter name="city" string="true">Paris "centre"</{DSML}parameter>\n'
    f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>\n'
    f'<{DSML}parameter name="when" string="false">not json</{DSML}parameter>\n'
    f"</{DSML}invoke>\n"
    f'<{DSML}invoke name="get_time">\n'
    f'<{DSML}parameter name="zones" string="false">["CET", "UTC"]</{DSML}parameter>\n'
    f"</{DSML}invoke>\n"
    f"</{DSML}tool_calls>"
)
V4_CALLS = [
    ("get_weather", {"city": 'Paris "centre"', "days": 3, "when": "not json"}),
    ("get_time", {"zones": ["CET", "UTC"]}),
]


@pytest.mark.parametrize("pieces", split_everywhere(V4))
def test_deepseek_v4_dsml_calls_wherever_the_text_splits(pieces: list[str]) -> None:
    out = feed(DsmlToolParser(V4_BLOCK), pieces)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == V4_CALLS
    assert deltas(out) == {c.id: c.arguments for c in calls}
    assert texts(out, TextChunk) == "Let me look."


def test_dsml_streams_each_parameter_and_reads_v32_blocks_too() -> None:
    v32 = V4.replace("tool_calls>", "function_calls>")
    out = feed(DsmlToolParser(V32_BLOCK), [v32[i : i + 2] for i in range(0, len(v32), 2)])
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == V4_CALLS
    assert len([c for c in out if isinstance(c, ToolCallDeltaChunk)]) > 10
    # A V3.2 block is text to V4's parser (and the other way round): tags differ.
    assert not any(isinstance(c, ToolCallChunk) for c in feed(DsmlToolParser(V4_BLOCK), [v32]))


def test_read_dsml_and_a_block_without_an_invoke() -> None:
    assert [(c.name, json.loads(c.arguments)) for c in read_dsml(V4)] == V4_CALLS
    empty = f"<{DSML}tool_calls>nothing here</{DSML}tool_calls>"
    out = feed(DsmlToolParser(V4_BLOCK), [empty])
    assert texts(out, TextChunk) == empty and not deltas(out)


def test_the_core_registers_the_deepseek_parsers_by_name() -> None:
    factories = output_parsers.exo_output_parsers()
    assert {"hermes", "deepseek_v32", "deepseek_v4"} <= set(factories)
    card = ModelCard(
        model_id=ModelId("m"), family="deepseek", n_layers=1, hidden_size=1, storage_size_bytes=1
    )
    parser = factories["deepseek_v4"](card, GenerationParams())
    calls = [c for c in feed(parser, [V4]) if isinstance(c, ToolCallChunk)]
    assert [c.call.name for c in calls] == ["get_weather", "get_time"]
