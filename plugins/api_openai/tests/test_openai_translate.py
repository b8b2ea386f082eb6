"""OpenAI translation without HTTP: requests to `GenerationParams`, chunks to the wire."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from exo_api_openai import chat_answer, responses, translate
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    InvalidRequest,
    KeepAliveChunk,
    TaskId,
    TextChunk,
    ThinkingChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    TopLogprob,
    Usage,
)
from exo_core.plugin.dialect import GenerationFailed
from exo_core.testing.scripted_engine import ECHO, THINKER

T = TaskId("task-1")
USAGE = Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=1, reasoning_tokens=1)


def _chat(**body: Any) -> ChatCompletionRequest:
    return msgspec.convert({"model": "m", **body}, ChatCompletionRequest)


def _responses(**body: Any) -> ResponsesRequest:
    return msgspec.convert({"model": "m", **body}, ResponsesRequest)


def _data(frames: list[str]) -> list[Any]:
    return [json.loads(f.removeprefix("data: ")) for f in frames if not f.startswith(": ")]


def test_chat_messages_of_every_role() -> None:
    req = _chat(
        messages=[
            {"role": "developer", "content": "rules"},
            {
                "role": "system",
                "content": [{"type": "text", "text": "more "}, {"type": "text", "text": "rules"}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "hmm",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ]
    )
    m = translate.to_params(req, ECHO).messages
    assert [x.role for x in m] == ["system", "system", "user", "assistant", "tool"]
    assert m[1].content == "more rules"
    assert not isinstance(m[2].content, str)
    assert [p.type for p in m[2].content] == ["text", "image"]
    assert m[2].content[1].image_url == "https://x/cat.png"
    assert m[3].reasoning == "hmm" and m[3].tool_calls == (
        ToolCall(id="c1", name="f", arguments='{"a": 1}'),
    )
    assert (m[4].tool_call_id, m[4].content) == ("c1", "42")


def test_chat_settings() -> None:
    p = translate.to_params(
        _chat(
            messages=[{"role": "user", "content": "x"}],
            max_tokens=9,
            max_completion_tokens=5,
            stop="END",
            temperature=0,
            top_p=0.5,
            seed=3,
            logprobs=True,
            top_logprobs=3,
            presence_penalty=0,
            n=1,
            response_format={"type": "text"},
            user="someone",
            store=False,
        ),
        ECHO,
    )
    assert p.max_tokens == 5 and p.stop == ("END",)
    assert (p.sampling.temperature, p.sampling.top_p, p.sampling.seed) == (0, 0.5, 3)
    assert (p.logprobs, p.top_logprobs) == (True, 3)
    assert p.enable_thinking is None


def test_chat_tools_nested_and_flat() -> None:
    p = translate.to_params(
        _chat(
            messages=[{"role": "user", "content": "x"}],
            tools=[
                {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
                {"type": "function", "name": "b", "description": "flat"},
            ],
            tool_choice={"type": "function", "function": {"name": "b"}},
        ),
        ECHO,
    )
    assert [(t.name, t.description) for t in p.tools] == [("a", ""), ("b", "flat")]
    assert p.tools[0].parameters == {"type": "object"}
    assert p.tool_choice == "b"


def test_chat_thinking_switch() -> None:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    assert (
        translate.to_params(_chat(**base, reasoning_effort="none"), THINKER).enable_thinking
        is False
    )
    assert (
        translate.to_params(_chat(**base, reasoning_effort="high"), THINKER).enable_thinking is True
    )
    kwargs = {"enable_thinking": False}
    assert (
        translate.to_params(_chat(**base, chat_template_kwargs=kwargs), THINKER).enable_thinking
        is False
    )
    # A model that cannot think ignores the request: it would not think anyway.
    assert translate.to_params(_chat(**base, reasoning_effort="high"), ECHO).enable_thinking is None


@pytest.mark.parametrize(
    "body",
    [
        {"n": 3},
        {"logit_bias": {"1": 5}},
        {"response_format": {"type": "json_schema"}},
        {"tool_choice": "sometimes"},
        {
            "tools": [{"type": "function", "function": {"name": "a"}}],
            "tool_choice": {"type": "function", "function": {"name": "zzz"}},
        },
        {"stop": ["a", "b", "c", "d", "e"]},
        {"top_logprobs": 2},
        {"functions": [{"name": "f"}]},
        {"modalities": ["text", "audio"]},
        {"chat_template_kwargs": {"custom": 1}},
    ],
)
def test_chat_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        translate.to_params(_chat(messages=[{"role": "user", "content": "x"}], **body), ECHO)


def test_chat_stream_frames() -> None:
    s = chat_answer.ChatStream("m", include_usage=True)
    frames = s.start()
    for c in [
        ThinkingChunk(task_id=T, text="hm"),
        TextChunk(
            task_id=T,
            text="hi",
            logprobs=(TokenLogprob(token="hi", logprob=-0.1, top=(TopLogprob("hi", -0.1),)),),
        ),
        TextChunk(task_id=T, text=""),
        KeepAliveChunk(task_id=T),
        ToolCallChunk(task_id=T, call=ToolCall(id="c", name="f", arguments="{}")),
        ToolCallChunk(task_id=T, call=ToolCall(id="d", name="g", arguments="{}")),
        FinishChunk(task_id=T, finish_reason=FinishReason.TOOL_CALLS, usage=USAGE),
    ]:
        frames += s.feed(c)
    assert all(f.endswith("\n\n") for f in frames)
    assert ": keep-alive\n\n" in frames
    assert frames[-1] == "data: [DONE]\n\n"
    data = _data(frames[:-1])
    deltas = [d["choices"][0]["delta"] for d in data if d["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"reasoning_content": "hm"}
    assert deltas[2] == {"content": "hi"}
    assert data[2]["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["token"] == "hi"
    assert [d["tool_calls"][0]["index"] for d in deltas[3:5]] == [0, 1]
    assert data[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert data[-1]["choices"] == [] and data[-1]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 1
    }


def test_chat_stream_errors_in_band() -> None:
    s = chat_answer.ChatStream("m")
    frames = s.feed(ErrorChunk(task_id=T, message="boom"))
    assert _data(frames[:1])[0]["error"]["message"] == "boom"
    assert frames[-1] == "data: [DONE]\n\n"
    cancelled = s.feed(FinishChunk(task_id=T, finish_reason=FinishReason.CANCELLED))
    assert "error" in _data(cancelled[:1])[0]


def test_chat_completion_object() -> None:
    chunks: list[Chunk] = [
        ThinkingChunk(task_id=T, text="hm"),
        TextChunk(task_id=T, text="a"),
        TextChunk(task_id=T, text="b"),
        FinishChunk(task_id=T, finish_reason=FinishReason.LENGTH, usage=USAGE),
    ]
    result = chat_answer.completion("m", chunks)
    choice = result["choices"][0]
    assert choice["message"]["content"] == "ab" and choice["message"]["reasoning_content"] == "hm"
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert result["usage"]["total_tokens"] == 7
    assert result["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}
    with pytest.raises(GenerationFailed, match=r"^x$"):
        chat_answer.completion("m", [ErrorChunk(task_id=T, message="x")])
    with pytest.raises(GenerationFailed, match="without finishing"):
        chat_answer.completion("m", chunks[:1])


def test_responses_input_items() -> None:
    req = _responses(
        instructions="be nice",
        input=[
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "calling"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ],
    )
    m = responses.input_messages(req)
    assert [x.role for x in m] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert m[3].content == "calling" and m[3].reasoning == "thought"
    assert [c.id for c in m[3].tool_calls] == ["c1", "c2"]
    assert (m[4].tool_call_id, m[4].content, m[5].content) == ("c1", "one", "two")


def test_responses_params() -> None:
    p = responses.to_params(
        _responses(
            input="hi",
            max_output_tokens=7,
            top_logprobs=2,
            reasoning={"effort": "minimal"},
            tools=[{"type": "function", "name": "f", "parameters": {}}],
            tool_choice={"type": "function", "name": "f"},
        ),
        THINKER,
    )
    assert p.max_tokens == 7 and p.logprobs and p.top_logprobs == 2
    assert p.enable_thinking is False and p.tool_choice == "f"


def test_responses_events() -> None:
    b = responses.ResponseBuilder("m", {}, logprobs=False)
    frames = b.start()
    for c in [
        ThinkingChunk(task_id=T, text="hm"),
        TextChunk(task_id=T, text="a"),
        ToolCallChunk(task_id=T, call=ToolCall(id="c", name="f", arguments='{"x":1}')),
        FinishChunk(task_id=T, finish_reason=FinishReason.TOOL_CALLS, usage=USAGE),
    ]:
        frames += b.feed(c)
    events = [json.loads(f.split("\n")[1].removeprefix("data: ")) for f in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "a"
    assert final["usage"]["input_tokens"] == 5 and final["status"] == "completed"
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}


def test_responses_failure() -> None:
    b = responses.ResponseBuilder("m", {})
    b.feed(TextChunk(task_id=T, text="a"))
    frames = b.feed(ErrorChunk(task_id=T, message="boom"))
    last = json.loads(frames[-1].split("\n")[1].removeprefix("data: "))
    assert last["type"] == "response.failed" and last["response"]["error"]["message"] == "boom"
    with pytest.raises(GenerationFailed, match=r"^x$"):
        responses.build(responses.ResponseBuilder("m", {}), [ErrorChunk(task_id=T, message="x")])
    with pytest.raises(GenerationFailed, match="without finishing"):
        responses.build(responses.ResponseBuilder("m", {}), [TextChunk(task_id=T, text="a")])
