"""Anthropic translation without HTTP: requests to `GenerationParams`, chunks to the wire."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from exo_api_claude import translate
from exo_api_claude.types import MessagesRequest
from exo_core.plugin import (
    ErrorChunk,
    FinishChunk,
    FinishReason,
    InvalidRequest,
    KeepAliveChunk,
    TaskId,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    Usage,
)
from exo_core.plugin.dialect import GenerationFailed
from exo_core.testing.scripted_engine import ECHO, THINKER

T = TaskId("task-1")
USAGE = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4)


def _req(**body: Any) -> MessagesRequest:
    return msgspec.convert({"model": "m", "max_tokens": 10, **body}, MessagesRequest)


def _events(frames: list[str]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        name, data = frame.removesuffix("\n\n").split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        out.append(payload)
    return out


def test_conversation() -> None:
    req = _req(
        system=[{"type": "text", "text": "be "}, {"type": "text", "text": "kind"}],
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "need a tool", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "sun"}],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "down",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and?"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                ],
            },
        ],
    )
    m = translate.messages(req)
    assert [x.role for x in m] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert m[0].content == "be kind"
    assert (m[2].content, m[2].reasoning) == ("checking", "need a tool")
    assert m[2].tool_calls == (ToolCall(id="t1", name="w", arguments='{"city": "Rome"}'),)
    assert (m[3].tool_call_id, m[3].content) == ("t1", "sun")
    assert m[4].content == "Error: down"
    assert not isinstance(m[5].content, str)
    assert [p.type for p in m[5].content] == ["text", "image"]


def test_base64_image_becomes_data_url() -> None:
    req = _req(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                    }
                ],
            }
        ]
    )
    content = translate.messages(req)[0].content
    assert not isinstance(content, str)
    assert content[0].image_url == "data:image/jpeg;base64,QUJD"


def test_settings() -> None:
    p = translate.to_params(
        _req(
            messages=[{"role": "user", "content": "x"}],
            stop_sequences=["END"],
            temperature=0.2,
            top_p=0.9,
            top_k=4,
            tools=[{"name": "w", "input_schema": {"type": "object"}}],
            tool_choice={"type": "any"},
            thinking={"type": "enabled", "budget_tokens": 2048},
        ),
        THINKER,
    )
    assert (p.max_tokens, p.stop) == (10, ("END",))
    assert (p.sampling.temperature, p.sampling.top_p, p.sampling.top_k) == (0.2, 0.9, 4)
    assert p.tools[0].name == "w" and p.tool_choice == "required"
    assert p.enable_thinking is True
    off = translate.to_params(
        _req(messages=[{"role": "user", "content": "x"}], thinking={"type": "disabled"}), ECHO
    )
    assert off.enable_thinking is False


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"tools": [{"name": "w"}]},
        {
            "tools": [{"name": "w", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "zz"},
        },
        {"mcp_servers": [{"url": "x"}]},
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}
            ]
        },
        {"stop_sequences": [""]},
    ],
)
def test_refusals(body: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], **body}
    with pytest.raises(InvalidRequest):
        translate.to_params(_req(**body), ECHO)


def test_stream_events() -> None:
    s = translate.MessageStream("m")
    frames = s.start()
    for c in [
        ThinkingChunk(task_id=T, text="hm"),
        TextChunk(task_id=T, text="a"),
        TextChunk(task_id=T, text="b"),
        KeepAliveChunk(task_id=T),
        ToolCallChunk(task_id=T, call=ToolCall(id="c", name="f", arguments='{"x": 1}')),
        FinishChunk(task_id=T, finish_reason=FinishReason.TOOL_CALLS, usage=USAGE),
    ]:
        frames += s.feed(c)
    events = _events(frames)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None),
        ("ping", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("ping", None),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[10]["content_block"] == {"type": "tool_use", "id": "c", "name": "f", "input": {}}
    assert events[11]["delta"] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert events[13]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[13]["usage"] == {
        "input_tokens": 6,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
    }
    error = _events(s.feed(ErrorChunk(task_id=T, message="boom")))
    assert error == [{"type": "error", "error": {"type": "api_error", "message": "boom"}}]


def test_message_object() -> None:
    result = translate.message(
        "m",
        [
            ThinkingChunk(task_id=T, text="h"),
            ThinkingChunk(task_id=T, text="m"),
            TextChunk(task_id=T, text="a"),
            ToolCallChunk(task_id=T, call=ToolCall(id="c", name="f", arguments="not json")),
            FinishChunk(task_id=T, finish_reason=FinishReason.LENGTH, usage=USAGE),
        ],
    )
    assert result["content"] == [
        {"type": "thinking", "thinking": "hm", "signature": ""},
        {"type": "text", "text": "a"},
        {"type": "tool_use", "id": "c", "name": "f", "input": {"_raw_arguments": "not json"}},
    ]
    assert result["stop_reason"] == "max_tokens"
    cancelled = FinishChunk(task_id=T, finish_reason=FinishReason.CANCELLED)
    with pytest.raises(GenerationFailed, match="cancelled"):
        translate.message("m", [cancelled])
    with pytest.raises(GenerationFailed, match="boom"):
        translate.message("m", [ErrorChunk(task_id=T, message="boom")])
    with pytest.raises(GenerationFailed, match="without finishing"):
        translate.message("m", [TextChunk(task_id=T, text="a")])


def test_stop_reasons() -> None:
    stop = FinishChunk(task_id=T, finish_reason=FinishReason.STOP)
    assert translate.stop_reason(stop) == ("end_turn", None)
    on_sequence = FinishChunk(task_id=T, finish_reason=FinishReason.STOP, stop_sequence="END")
    assert translate.stop_reason(on_sequence) == ("stop_sequence", "END")
    length = FinishChunk(task_id=T, finish_reason=FinishReason.LENGTH)
    assert translate.stop_reason(length) == ("max_tokens", None)
    tools = FinishChunk(task_id=T, finish_reason=FinishReason.TOOL_CALLS)
    assert translate.stop_reason(tools) == ("tool_use", None)
