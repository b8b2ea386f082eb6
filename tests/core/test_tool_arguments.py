"""Tool-call arguments coerced to the tool's schema, whole and streamed (`exo_core.tool_*`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_core.plugin import TaskId, ToolCall, ToolCallChunk, ToolCallDeltaChunk, ToolSpec
from exo_core.plugin.parsers import ArgumentStream
from exo_core.tool_arguments import CallCoercion, coerce_arguments
from exo_core.tool_schema import coerce_value, keeps_strings

INT, NUM, BOOL, STR = ({"type": t} for t in ("integer", "number", "boolean", "string"))
OBJ = {"type": "object", "properties": {"n": INT, "flag": BOOL}}


@pytest.mark.parametrize(
    ("value", "schema", "expected"),
    [
        ("5", INT, 5),
        (" -12 ", INT, -12),
        ("5.0", INT, 5),
        (5.0, INT, 5),
        ("5.5", INT, "5.5"),  # not exact: left as written
        ("five", INT, "five"),
        ("2.5", NUM, 2.5),
        ("7", NUM, 7),
        ("1e3", NUM, 1000.0),
        ("nan", NUM, "nan"),
        ("1e999", NUM, "1e999"),  # not finite
        ("true", BOOL, True),
        ("FALSE", BOOL, False),
        ("yes", BOOL, "yes"),
        (True, INT, True),  # a boolean is not a number
        ("null", {"type": "null"}, None),
        (5, STR, "5"),
        (True, STR, "true"),
        ('{"n": "3", "flag": "true"}', OBJ, {"n": 3, "flag": True}),  # JSON in a string
        ("[1, 2]", OBJ, "[1, 2]"),
        ('["1", "2"]', {"type": "array", "items": INT}, [1, 2]),
        ({"outer": {"n": "4"}}, {"properties": {"outer": OBJ}}, {"outer": {"n": 4}}),
        ([{"n": "1"}, "x"], {"type": "array", "items": OBJ}, [{"n": 1}, "x"]),
        (["1", "a"], {"prefixItems": [INT, STR], "type": "array"}, [1, "a"]),
        # Type lists and unions: a value already allowed stays; else the first that fits.
        ("5", {"type": ["string", "integer"]}, "5"),
        ("5", {"type": ["integer", "string"]}, "5"),
        ("5", {"type": ["null", "integer"]}, 5),
        ("null", {"type": ["integer", "null"]}, None),
        ("5", {"anyOf": [INT, {"type": "null"}]}, 5),
        ("x", {"anyOf": [INT, {"type": "null"}]}, "x"),
        ("true", {"oneOf": [BOOL, INT]}, True),
        ({"n": "1"}, {"anyOf": [{"type": "null"}, OBJ]}, {"n": 1}),
        ("5", {"allOf": [INT]}, 5),
        # Local references, as pydantic writes nested models.
        (
            {"item": {"n": "2"}},
            {"$defs": {"Item": OBJ}, "properties": {"item": {"$ref": "#/$defs/Item"}}},
            {"item": {"n": 2}},
        ),
        ("5", {"additionalProperties": INT}, "5"),
        ({"x": "5"}, {"type": "object", "additionalProperties": INT}, {"x": 5}),
    ],
)
def test_values_are_coerced_only_where_the_schema_says_and_exactly(
    value: Any, schema: Any, expected: Any
) -> None:
    assert coerce_value(value, schema) == expected


LOOP = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
# A few bytes that would take forever to walk: a union of references to itself.
BOMB = {
    "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}, INT]}},
    "properties": {"n": {"$ref": "#/$defs/A"}},
}


@pytest.mark.parametrize(
    "schema",
    [
        LOOP,
        BOMB,
        {"$ref": "http://elsewhere/schema.json"},
        {"$ref": "#/nowhere"},
        {"type": 5},
        {"type": [1, None, "integer"]},
        {"properties": []},
        {"properties": {"n": "not a schema"}},
        {"anyOf": "no"},
        {"anyOf": [1, 2]},
        {"items": [1, {"type": "integer"}], "type": "array"},
        "not a schema",
        None,
        [],
    ],
)
def test_odd_schemas_never_raise(schema: Any) -> None:
    for value in ("5", {"n": "5"}, ["5"], None, 1.5):
        coerce_value(value, schema)
    assert json.loads(coerce_arguments('{"n": "5", "m": [1]}', schema))["m"] == [1]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
TYPES = st.sampled_from(["integer", "number", "boolean", "string", "null", "object", "array"])
SCHEMAS = st.recursive(
    st.builds(dict)
    | st.builds(lambda t: {"type": t}, TYPES)
    | st.builds(lambda ts: {"type": ts}, st.lists(TYPES, max_size=3)),
    lambda inner: (
        st.builds(lambda b: {"anyOf": b}, st.lists(inner, max_size=3))
        | st.builds(
            lambda p: {"type": "object", "properties": p},
            st.dictionaries(st.text(max_size=3), inner),
        )
        | st.builds(lambda i: {"type": "array", "items": i}, inner)
        | st.builds(lambda a: {"allOf": [a]}, inner)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON, schema=SCHEMAS | JSON)
def test_coercion_never_raises_and_is_stable(value: Any, schema: Any) -> None:
    once = coerce_value(value, schema)
    assert coerce_value(once, schema) == once  # coercing twice changes nothing more


@settings(max_examples=300, deadline=None)
@given(text=st.text(), schema=SCHEMAS)
def test_a_schema_that_keeps_strings_keeps_every_string(text: str, schema: Any) -> None:
    if keeps_strings(schema):
        assert coerce_value(text, schema) == text


def pieces(text: str, cuts: list[int]) -> list[str]:
    at = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]


def streamed(raw: list[str], schema: Any) -> list[str]:
    stream = ArgumentStream(schema)
    out = [stream.feed(piece) for piece in raw]
    out.append(stream.finish())
    assert "".join(out) == stream.text
    return out


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=5), JSON, max_size=4),
    schema=SCHEMAS,
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
    indent=st.sampled_from([None, 2]),
)
def test_streamed_arguments_are_the_whole_arguments_coerced(
    value: dict[str, Any], schema: Any, cuts: list[int], indent: int | None
) -> None:
    raw = json.dumps(value, indent=indent)
    text = "".join(streamed(pieces(raw, cuts), schema))
    assert text == coerce_arguments(raw, schema)
    assert json.loads(text) == coerce_value(value, schema)
    text.encode()  # always valid UTF-8


def test_a_string_argument_streams_as_written_and_a_typed_one_waits() -> None:
    schema = {"type": "object", "properties": {"body": STR, "n": INT}}
    out = streamed(['{"body": "Hel', "lo\\nwor", 'ld", "n": "4', '2"}'], schema)
    assert out == ['{"body": "Hel', "lo\\nwor", 'ld"', ', "n": 42}', ""]


def test_streamed_members_follow_refs_into_the_tools_whole_schema() -> None:
    schema = {
        "$defs": {"Count": INT, "Text": STR},
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/Count"}, "s": {"$ref": "#/$defs/Text"}},
    }
    out = streamed(['{"s": "ab', 'c", "n": "1', '2"}'], schema)
    assert out == ['{"s": "ab', 'c"', ', "n": 12}', ""]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1', {"a": 1}),  # cut off: closed
        ('{"a": "x', {"a": "x"}),
        ('{"a": tru', {"a": "tru"}),  # not JSON: the text the model wrote
        ('{"a": 1, "a": 2}', {"a": 1}),  # a repeated key keeps its first value
        ('{"a": 1} and then some', {"a": 1}),
        ('{"a": "\\ud83d\\ude00 \\ud83d"}', {"a": "\U0001f600 \ufffd"}),  # pairs; lone halves
        ('{"a": "line\none"}', {"a": "line\none"}),  # a raw newline, as models write
        ('"{\\"a\\": 1}"', {"a": 1}),  # the object as a string of JSON
        ("", {}),
    ],
)
def test_what_models_write_comes_out_as_one_json_object(raw: str, expected: Any) -> None:
    for cut in range(len(raw) + 1):
        assert json.loads("".join(streamed([raw[:cut], raw[cut:]], None))) == expected


def test_arguments_that_are_not_json_are_kept_as_written() -> None:
    assert coerce_arguments("not json", None) == "not json"
    assert coerce_arguments("[1, 2]", None) == "[1, 2]"


T = TaskId("t")


def test_the_generation_coerces_streamed_and_whole_calls_alike() -> None:
    tool = ToolSpec(name="f", parameters={"type": "object", "properties": {"n": INT}})
    coercion = CallCoercion([tool])

    def delta(text: str) -> ToolCallDeltaChunk:
        return ToolCallDeltaChunk(task_id=T, id="c1", name="f", arguments=text)

    out = [
        *coercion.feed(delta("")),
        *coercion.feed(delta('{"n": "')),
        *coercion.feed(delta('7"}')),
    ]
    out += coercion.feed(ToolCallChunk(task_id=T, call=ToolCall(id="c1", name="f", arguments="")))
    deltas = [c.arguments for c in out if isinstance(c, ToolCallDeltaChunk)]
    whole = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert deltas == ["", "{", '"n": 7}']  # the first names the call; "7" waits for its end
    assert [c.arguments for c in whole] == ['{"n": 7}'] == ["".join(deltas)]
    # A call that came whole (an engine reading its block at once) and an unknown tool.
    came_whole = ToolCall(id="c2", name="f", arguments='{"n": "8"}')
    unknown = ToolCall(id="c3", name="g", arguments='{"n": "8"}')
    assert coercion.feed(ToolCallChunk(task_id=T, call=came_whole)) == [
        ToolCallChunk(task_id=T, call=ToolCall(id="c2", name="f", arguments='{"n": 8}'))
    ]
    assert coercion.feed(ToolCallChunk(task_id=T, call=unknown))[0].call.arguments == (  # type: ignore[union-attr]
        '{"n": "8"}'
    )
