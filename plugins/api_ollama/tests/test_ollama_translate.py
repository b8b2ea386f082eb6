"""Ollama translation without HTTP: requests to `GenerationParams`, chunks to NDJSON."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from exo_api_ollama import models, translate
from exo_api_ollama.types import ChatRequest, GenerateRequest
from exo_core.plugin import (
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
    Usage,
)
from exo_core.plugin.dialect import GenerationFailed
from exo_core.testing.scripted_engine import ECHO, THINKER

T = TaskId("task-1")


def _chat(**body: Any) -> ChatRequest:
    return msgspec.convert({"model": "m", **body}, ChatRequest)


def _generate(**body: Any) -> GenerateRequest:
    return msgspec.convert({"model": "m", **body}, GenerateRequest)


def test_messages_pair_tool_results_with_calls() -> None:
    req = _chat(
        messages=[
            {"role": "user", "content": "two cities", "images": ["iVBORw0KGgo="]},
            {
                "role": "assistant",
                "content": "",
                "thinking": "hm",
                "tool_calls": [
                    {"function": {"name": "w", "arguments": {"city": "A"}}},
                    {"function": {"name": "w", "arguments": {"city": "B"}}},
                ],
            },
            {"role": "tool", "content": "sun", "tool_name": "w"},
            {"role": "tool", "content": "rain", "tool_name": "w"},
        ]
    )
    m = translate.messages(req.messages)
    assert not isinstance(m[0].content, str)
    assert m[0].content[1].image_url == "data:image/png;base64,iVBORw0KGgo="
    calls = m[1].tool_calls
    assert [json.loads(c.arguments) for c in calls] == [{"city": "A"}, {"city": "B"}]
    assert m[1].reasoning == "hm"
    assert [(t.tool_call_id, t.name) for t in m[2:]] == [(calls[0].id, "w"), (calls[1].id, "w")]
    assert len({c.id for c in calls}) == 2


def test_options() -> None:
    p = translate.chat_params(
        _chat(
            messages=[{"role": "user", "content": "x"}],
            options={
                "temperature": 0,
                "top_p": 0.8,
                "top_k": 5,
                "min_p": 0.1,
                "seed": 9,
                "num_predict": 12,
                "stop": ["END"],
                "repeat_penalty": 1.2,
                "repeat_last_n": 32,
                "num_ctx": 8192,
                "mirostat": 0,
            },
            logprobs=True,
            top_logprobs=2,
        ),
        ECHO,
    )
    s = p.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0, 0.8, 5, 0.1, 9)
    assert (s.repetition_penalty, s.repetition_context_size) == (1.2, 32)
    assert (p.max_tokens, p.stop, p.logprobs, p.top_logprobs) == (12, ("END",), True, 2)
    unlimited = translate.chat_params(
        _chat(messages=[{"role": "user", "content": "x"}], options={"num_predict": -2}), ECHO
    )
    assert unlimited.max_tokens is None


def test_think() -> None:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    assert translate.chat_params(_chat(**base, think=True), THINKER).enable_thinking is True
    assert translate.chat_params(_chat(**base, think="low"), THINKER).enable_thinking is True
    assert translate.chat_params(_chat(**base, think=False), THINKER).enable_thinking is False
    assert translate.chat_params(_chat(**base, think=False), ECHO).enable_thinking is None
    with pytest.raises(InvalidRequest, match="does not support thinking"):
        translate.chat_params(_chat(**base, think=True), ECHO)


def test_think_level_is_the_reasoning_effort() -> None:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    for level in ("low", "medium", "high"):
        params = translate.chat_params(_chat(**base, think=level), THINKER)
        assert params.reasoning_effort == level
        generated = translate.generate_params(_generate(prompt="x", think=level), THINKER)
        assert generated.reasoning_effort == level
    assert translate.chat_params(_chat(**base, think=True), THINKER).reasoning_effort is None
    assert translate.chat_params(_chat(**base), THINKER).reasoning_effort is None


def test_generate_modes() -> None:
    templated = translate.generate_params(_generate(prompt="hi", system="sys"), ECHO)
    assert [m.role for m in templated.messages] == ["system", "user"] and templated.prompt is None
    raw = translate.generate_params(_generate(prompt="hi", raw=True), ECHO)
    assert raw.prompt == "hi" and not raw.messages


@pytest.mark.parametrize(
    "body",
    [
        {"format": "json"},
        {"format": {"type": "object"}},
        {"options": {"typical_p": 0.5}},
        {"options": {"num_predict": 0}},
        {"suffix": "tail"},
        {"template": "{{ .Prompt }}"},
        {"context": [1, 2]},
        {"raw": True, "images": ["iVBOR"]},
    ],
)
def test_generate_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        translate.generate_params(_generate(prompt="x", **body), ECHO)


def test_unload_detection() -> None:
    assert translate.is_unload(0) and translate.is_unload("0") and translate.is_unload("0s")
    assert not translate.is_unload(None) and not translate.is_unload("5m")


def test_chat_lines_and_result() -> None:
    usage = Usage(prompt_tokens=4, completion_tokens=2, prompt_tps=100.0, generation_tps=10.0)
    chunks = [
        ThinkingChunk(task_id=T, text="hm"),
        TextChunk(task_id=T, text="a", logprobs=(TokenLogprob(token="a", logprob=-1.0),)),
        KeepAliveChunk(task_id=T),
        ToolCallChunk(task_id=T, call=ToolCall(id="c", name="f", arguments='{"x": 1}')),
        FinishChunk(task_id=T, finish_reason=FinishReason.STOP, usage=usage),
    ]
    reply = translate.Reply("m", "chat")
    lines = [line for c in chunks for line in reply.feed(c)]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    objs = [json.loads(line) for line in lines]
    assert objs[0]["message"] == {"role": "assistant", "content": "", "thinking": "hm"}
    assert objs[1]["logprobs"] == [{"token": "a", "logprob": -1.0, "top_logprobs": []}]
    assert objs[2]["message"] == {"role": "assistant", "content": ""} and objs[2]["done"] is False
    assert objs[3]["message"]["tool_calls"] == [
        {"id": "c", "function": {"index": 0, "name": "f", "arguments": {"x": 1}}}
    ]
    final = objs[-1]
    assert final["done"] and final["done_reason"] == "stop"
    assert (final["prompt_eval_count"], final["eval_count"]) == (4, 2)
    assert (final["prompt_eval_duration"], final["eval_duration"]) == (40_000_000, 200_000_000)
    whole = translate.Reply("m", "chat").result(chunks)
    assert whole["message"]["content"] == "a" and whole["message"]["thinking"] == "hm"
    assert whole["message"]["tool_calls"][0]["function"]["name"] == "f"


def test_generate_lines_and_errors() -> None:
    reply = translate.Reply("m", "generate")
    line = json.loads(reply.feed(TextChunk(task_id=T, text="a"))[0])
    assert line["response"] == "a" and "message" not in line
    capped = reply.feed(FinishChunk(task_id=T, finish_reason=FinishReason.LENGTH))
    assert json.loads(capped[0])["done_reason"] == "length"
    failed = translate.Reply("m", "generate")
    assert json.loads(failed.feed(ErrorChunk(task_id=T, message="boom"))[0]) == {"error": "boom"}
    with pytest.raises(GenerationFailed, match=r"^x$"):
        translate.Reply("m", "chat").result([ErrorChunk(task_id=T, message="x")])
    with pytest.raises(GenerationFailed, match="without finishing"):
        translate.Reply("m", "chat").result([TextChunk(task_id=T, text="a")])


def test_model_entries() -> None:
    entry = models.model_entry(ECHO, "2026-01-01T00:00:00Z")
    assert entry["name"] == entry["model"] == "scripted-echo"
    assert len(entry["digest"]) == 64 and entry["size"] == ECHO.storage_size_bytes
    shown = models.show(THINKER, "2026-01-01T00:00:00Z")
    assert shown["capabilities"] == ["completion", "thinking", "tools"]
    assert shown["model_info"]["scripted.block_count"] == THINKER.n_layers
