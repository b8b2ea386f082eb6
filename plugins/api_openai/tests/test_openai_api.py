"""The OpenAI dialect against a running node: the official client, then the raw wire."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from exo_core.testing.harness import RunningNode

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def test_chat_completion(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(
        model="scripted-echo",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
    )
    choice = r.choices[0]
    assert choice.message.content == "echo: hello there"
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert r.object == "chat.completion"
    assert r.model == "scripted-echo"
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, 3)
    assert r.usage.total_tokens == 7


def test_chat_stream_with_usage(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: one two three"
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert not chunks[-1].choices
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert len({c.id for c in chunks}) == 1


def test_chat_limits_and_stop(oai: openai.OpenAI) -> None:
    capped = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "one two three"}],
        max_completion_tokens=2,
    )
    assert capped.choices[0].message.content == "echo: one"
    assert capped.choices[0].finish_reason == "length"
    legacy = oai.chat.completions.create(
        model="scripted-echo", messages=[{"role": "user", "content": "one two three"}], max_tokens=1
    )
    assert legacy.choices[0].message.content == "echo:"
    stopped = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "one two three four"}],
        stop=[" three", "zzz"],
        temperature=0,
        top_p=0.5,
        seed=7,
    )
    assert stopped.choices[0].message.content == "echo: one two"
    assert stopped.choices[0].finish_reason == "stop"
    single = oai.chat.completions.create(
        model="scripted-echo", messages=[{"role": "user", "content": "one two"}], stop=" two"
    )
    assert single.choices[0].message.content == "echo: one"


def test_chat_logprobs(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=2,
    )
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [t.token for t in logprobs.content] == ["echo:", " hi"]
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in logprobs.content)
    assert logprobs.content[0].bytes == list(b"echo:")
    streamed = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        stream=True,
    )
    tokens = [
        t.token
        for c in streamed
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for t in c.choices[0].logprobs.content
    ]
    assert tokens == ["echo:", " hi"]


def test_chat_thinking(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(
        model="scripted-thinker", messages=[{"role": "user", "content": "think"}]
    )
    message: Any = r.choices[0].message
    assert message.content == "echo: think"
    assert message.reasoning_content == "pondering"
    stream = oai.chat.completions.create(
        model="scripted-thinker",
        messages=[{"role": "user", "content": "think"}],
        stream=True,
        reasoning_effort="high",
    )
    deltas: list[Any] = [c.choices[0].delta for c in stream if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == ("pondering", "echo: think")


def test_chat_tool_round_trip(oai: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Paris"}]
    first = oai.chat.completions.create(
        model="scripted-echo", messages=messages, tools=[WEATHER], tool_choice="auto"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call: Any = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"query": "Paris"}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = oai.chat.completions.create(model="scripted-echo", messages=messages, tools=[WEATHER])
    assert second.choices[0].message.content == "tool said: sunny"
    assert second.choices[0].finish_reason == "stop"


def test_chat_tool_call_streamed(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "Oslo"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    # The first delta names the call; the arguments follow in fragments as they are written.
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type) == (0, "function")
    assert first.id and first.function and first.function.name == "get_weather"
    assert rest and all(d.index == 0 and not d.id and not d.type for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(arguments) == {"query": "Oslo"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_chat_tool_choice_none_answers(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": "Oslo"}],
        tools=[WEATHER],
        tool_choice="none",
    )
    assert r.choices[0].message.content == "echo: Oslo"


def test_responses(oai: openai.OpenAI) -> None:
    r = oai.responses.create(
        model="scripted-echo", input="hello world", instructions="be brief", max_output_tokens=10
    )
    assert r.output_text == "echo: hello world"
    assert r.status == "completed"
    assert r.instructions == "be brief" and r.max_output_tokens == 10
    assert r.usage is not None and r.usage.output_tokens == 3 and r.usage.total_tokens > 3
    capped = oai.responses.create(model="scripted-echo", input="a b c", max_output_tokens=2)
    assert capped.status == "incomplete"
    assert capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_output_tokens"


def test_responses_stream(oai: openai.OpenAI) -> None:
    events = list(oai.responses.create(model="scripted-thinker", input="hi you", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (text, reasoning) == ("echo: hi you", "pondering")
    final: Any = events[-1]
    assert final.response.output_text == "echo: hi you"
    assert [item.type for item in final.response.output] == ["reasoning", "message"]


def test_responses_tool_round_trip(oai: openai.OpenAI) -> None:
    flat_tool: Any = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
    first = oai.responses.create(model="scripted-echo", input="Rome", tools=[flat_tool])
    calls: list[Any] = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"query": "Rome"}
    second = oai.responses.create(
        model="scripted-echo",
        tools=[flat_tool],
        input=[
            {"role": "user", "content": "Rome"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "warm"},
        ],
    )
    assert second.output_text == "tool said: warm"


def test_responses_tool_call_streamed(oai: openai.OpenAI) -> None:
    events: list[Any] = list(
        oai.responses.create(
            model="scripted-echo",
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Rome"}],
                }
            ],
            tools=[{"type": "function", "name": "get_weather", "parameters": {}, "strict": False}],
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert deltas > 1  # the arguments stream as they are written
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-3]
    assert json.loads(done.arguments) == {"query": "Rome"}
    assert "".join(e.delta for e in events[3:-3]) == done.arguments
    assert events[-2].item.status == "completed"


def test_models(oai: openai.OpenAI) -> None:
    ids = [m.id for m in oai.models.list()]
    assert {"scripted-echo", "scripted-thinker"} <= set(ids)
    model = oai.models.retrieve("scripted-echo")
    assert model.id == "scripted-echo" and model.object == "model"


# -- the raw wire ----------------------------------------------------------------------------


def _sse_events(body: str) -> list[str]:
    assert body.endswith("\n\n"), "every event ends with a blank line"
    return body[:-2].split("\n\n")


def test_chat_sse_framing(node: RunningNode) -> None:
    r = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={
            "model": "scripted-echo",
            "messages": [{"role": "user", "content": "a b"}],
            "stream": True,
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(r.text)
    assert events[-1] == "data: [DONE]"
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event
        payloads.append(json.loads(event.removeprefix("data: ")))
    for p in payloads:
        assert p["object"] == "chat.completion.chunk"
        assert set(p) >= {"id", "created", "model", "choices"}
        assert set(p["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
    assert payloads[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_responses_sse_framing(node: RunningNode) -> None:
    r = httpx.post(
        f"{node.url}/v1/responses",
        json={"model": "scripted-echo", "input": "a b", "stream": True},
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    kinds = []
    for n, event in enumerate(_sse_events(r.text)):
        name, data = event.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        assert payload["sequence_number"] == n
        kinds.append(payload["type"])
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
