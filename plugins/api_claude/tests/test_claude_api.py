"""The Anthropic dialect against a running node: the official client, then the raw wire."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
from anthropic.types import MessageParam

from exo_core.testing.harness import RunningNode

WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


def test_message(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(
        model="scripted-echo",
        max_tokens=20,
        system="be brief",
        messages=[{"role": "user", "content": "hello there"}],
    )
    assert [b.type for b in m.content] == ["text"]
    block: Any = m.content[0]
    assert block.text == "echo: hello there"
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.role == "assistant" and m.type == "message" and m.model == "scripted-echo"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (4, 3)


def test_system_blocks_and_block_content(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(
        model="scripted-echo",
        max_tokens=20,
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "blocks work"}]}],
        metadata={"user_id": "someone"},
    )
    block: Any = m.content[0]
    assert block.text == "echo: blocks work"


def test_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="scripted-echo", max_tokens=20, messages=[{"role": "user", "content": "one two"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "echo: one two"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3 and final.usage.input_tokens == 2


def test_max_tokens_and_stop_sequences(claude: anthropic.Anthropic) -> None:
    capped = claude.messages.create(
        model="scripted-echo", max_tokens=2, messages=[{"role": "user", "content": "one two three"}]
    )
    assert capped.stop_reason == "max_tokens"
    assert [getattr(b, "text", None) for b in capped.content] == ["echo: one"]
    stopped = claude.messages.create(
        model="scripted-echo",
        max_tokens=20,
        stop_sequences=[" three"],
        # This client version no longer has these as arguments; the API still takes them.
        extra_body={"temperature": 0, "top_k": 5, "top_p": 0.9},
        messages=[{"role": "user", "content": "one two three four"}],
    )
    assert [getattr(b, "text", None) for b in stopped.content] == ["echo: one two"]
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " three"
    with claude.messages.stream(
        model="scripted-echo",
        max_tokens=20,
        stop_sequences=["zzz", " four"],
        messages=[{"role": "user", "content": "one two three four"}],
    ) as stream:
        streamed = stream.get_final_message()
    assert [getattr(b, "text", None) for b in streamed.content] == ["echo: one two three"]
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == " four"


def test_thinking(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(
        model="scripted-thinker",
        max_tokens=50,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "think"}],
    )
    assert [b.type for b in m.content] == ["thinking", "text"]
    thinking: Any = m.content[0]
    assert thinking.thinking == "pondering" and thinking.signature == ""
    with claude.messages.stream(
        model="scripted-thinker", max_tokens=50, messages=[{"role": "user", "content": "think"}]
    ) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert ("content_block_delta", "thinking_delta") in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert getattr(final.content[0], "thinking", None) == "pondering"
    # Thinking sent back in an assistant turn is accepted.
    follow = claude.messages.create(
        model="scripted-thinker",
        max_tokens=50,
        messages=[
            {"role": "user", "content": "think"},
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},  # type: ignore[misc]
            {"role": "user", "content": "again"},
        ],
    )
    assert getattr(follow.content[-1], "text", None) == "echo: again"


def test_tool_round_trip(claude: anthropic.Anthropic) -> None:
    messages: list[MessageParam] = [{"role": "user", "content": "Lima"}]
    first = claude.messages.create(
        model="scripted-echo",
        max_tokens=50,
        tools=[WEATHER],
        tool_choice={"type": "auto"},
        messages=messages,
    )
    assert first.stop_reason == "tool_use"
    uses: list[Any] = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"query": "Lima"}
    messages += [
        {"role": "assistant", "content": [u.model_dump() for u in uses]},  # type: ignore[misc]
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "foggy"}],
        },
    ]
    second = claude.messages.create(
        model="scripted-echo", max_tokens=50, tools=[WEATHER], messages=messages
    )
    assert getattr(second.content[0], "text", None) == "tool said: foggy"
    assert second.stop_reason == "end_turn"


def test_tool_use_streamed(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="scripted-echo",
        max_tokens=50,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Quito"}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(getattr(e, "type", "") == "input_json" for e in events)
    use: Any = final.content[0]
    assert use.type == "tool_use" and use.input == {"query": "Quito"}
    assert final.stop_reason == "tool_use"


def test_count_tokens(claude: anthropic.Anthropic) -> None:
    short = claude.messages.count_tokens(
        model="scripted-echo", messages=[{"role": "user", "content": "hi"}]
    )
    long = claude.messages.count_tokens(
        model="scripted-echo",
        system="a system prompt",
        tools=[WEATHER],
        messages=[{"role": "user", "content": "hi " * 100}],
    )
    assert 0 < short.input_tokens < long.input_tokens
    # Exact: what the engine counts for the same conversation in a message.
    reply = claude.messages.create(
        model="scripted-echo",
        max_tokens=4,
        system="a system prompt",
        tools=[WEATHER],
        messages=[{"role": "user", "content": "hi " * 100}],
    )
    assert long.input_tokens == reply.usage.input_tokens


# -- the raw wire ----------------------------------------------------------------------------


def test_sse_framing(node: RunningNode) -> None:
    r = httpx.post(
        f"{node.url}/v1/messages",
        headers={"anthropic-version": "2023-06-01"},
        json={
            "model": "scripted-thinker",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": "a"}],
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("\n\n")
    events = []
    for event in r.text[:-2].split("\n\n"):
        name, data = event.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        events.append(payload)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["role"] == "assistant" and start["content"] == [] and start["stop_reason"] is None
    assert events[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[3]["delta"] == {"type": "thinking_delta", "thinking": "pondering"}
    assert events[5] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "text", "text": ""},
    }
    assert events[6]["delta"] == {"type": "text_delta", "text": "echo:"}
    delta = events[9]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 2 and delta["usage"]["input_tokens"] == 1
