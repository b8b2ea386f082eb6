"""The Ollama dialect against a running node: the official client, then the raw wire."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama

from exo_core.testing.harness import RunningNode

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def test_chat(olla: ollama.Client) -> None:
    r = olla.chat(
        model="scripted-echo",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
        stream=False,
    )
    assert r.message.role == "assistant" and r.message.content == "echo: hello there"
    assert r.done and r.done_reason == "stop"
    assert (r.prompt_eval_count, r.eval_count) == (4, 3)
    assert r.total_duration is not None and r.total_duration > 0
    assert r.model == "scripted-echo"


def test_chat_stream(olla: ollama.Client) -> None:
    parts = list(
        olla.chat(model="scripted-echo", messages=[{"role": "user", "content": "a b"}], stream=True)
    )
    assert "".join(p.message.content or "" for p in parts) == "echo: a b"
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 3


def test_options(olla: ollama.Client) -> None:
    capped = olla.chat(
        model="scripted-echo",
        messages=[{"role": "user", "content": "one two three"}],
        options={"num_predict": 2, "temperature": 0, "seed": 1, "top_k": 3, "num_ctx": 4096},
    )
    assert capped.message.content == "echo: one" and capped.done_reason == "length"
    stopped = olla.chat(
        model="scripted-echo",
        messages=[{"role": "user", "content": "one two three four"}],
        options={"stop": [" three"], "repeat_penalty": 1.1, "top_p": 0.9, "min_p": 0.05},
    )
    assert stopped.message.content == "echo: one two" and stopped.done_reason == "stop"
    unlimited = olla.chat(
        model="scripted-echo",
        messages=[{"role": "user", "content": "x"}],
        options={"num_predict": -1},
    )
    assert unlimited.message.content == "echo: x"


def test_thinking(olla: ollama.Client) -> None:
    r = olla.chat(
        model="scripted-thinker", messages=[{"role": "user", "content": "hm"}], think=True
    )
    assert (r.message.thinking, r.message.content) == ("pondering", "echo: hm")
    parts = list(olla.generate(model="scripted-thinker", prompt="hm", think=True, stream=True))
    assert "".join(p.thinking or "" for p in parts) == "pondering"
    assert "".join(p.response or "" for p in parts) == "echo: hm"


def test_tool_round_trip(olla: ollama.Client) -> None:
    messages: list[Any] = [{"role": "user", "content": "Bern"}]
    first = olla.chat(model="scripted-echo", messages=messages, tools=[WEATHER])
    calls = first.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"query": "Bern"}
    messages += [
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "snowy", "tool_name": "get_weather"},
    ]
    second = olla.chat(model="scripted-echo", messages=messages, tools=[WEATHER])
    assert second.message.content == "tool said: snowy"


def test_generate(olla: ollama.Client) -> None:
    r = olla.generate(model="scripted-echo", prompt="hello you", system="be brief")
    assert r.response == "echo: hello you" and r.done and r.done_reason == "stop"
    raw = olla.generate(model="scripted-echo:latest", prompt="raw text", raw=True)
    assert raw.response == "echo: raw text"
    streamed = list(olla.generate(model="scripted-echo", prompt="a b", stream=True))
    assert "".join(p.response or "" for p in streamed) == "echo: a b"


def test_empty_request_loads_the_model(node: RunningNode) -> None:
    """As in Ollama, a chat without messages (or a generate without prompt) only loads the
    model; clients use it to preload."""
    for path, body in [
        ("/api/chat", {"model": "scripted-echo", "messages": []}),
        ("/api/chat", {"model": "scripted-echo", "stream": False}),
        ("/api/generate", {"model": "scripted-echo"}),
    ]:
        r = httpx.post(node.url + path, json=body)
        assert r.status_code == 200, r.text
        reply = json.loads(r.text)
        assert reply["done"] is True and reply["done_reason"] == "load"


def test_models(olla: ollama.Client) -> None:
    names = [m.model for m in olla.list().models]
    assert {"scripted-echo", "scripted-thinker"} <= set(names)
    olla.chat(model="scripted-echo", messages=[{"role": "user", "content": "x"}])
    assert "scripted-echo" in [m.model for m in olla.ps().models]
    shown = olla.show("scripted-thinker")
    assert shown.capabilities is not None
    assert {"completion", "thinking", "tools"} <= set(shown.capabilities)
    assert shown.details is not None and shown.details.family == "scripted"
    assert olla.show("scripted-echo:latest").capabilities == ["completion", "tools"]


def test_version_and_prefix(node: RunningNode) -> None:
    version = httpx.get(f"{node.url}/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 9, 0)
    assert httpx.get(f"{node.url}/ollama").text == "Ollama is running"
    client = ollama.Client(host=f"{node.url}/ollama")
    r = client.chat(model="scripted-echo", messages=[{"role": "user", "content": "prefixed"}])
    assert r.message.content == "echo: prefixed"
    assert "scripted-echo" in [m.model for m in client.list().models]


# -- the raw wire ----------------------------------------------------------------------------


def test_ndjson_framing(node: RunningNode) -> None:
    r = httpx.post(
        f"{node.url}/api/chat",
        json={"model": "scripted-echo", "messages": [{"role": "user", "content": "a b"}]},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    assert r.text.endswith("\n")
    lines = [json.loads(line) for line in r.text[:-1].split("\n")]
    assert len(lines) == 4
    for line in lines[:-1]:
        assert set(line) == {"model", "created_at", "message", "done"} and line["done"] is False
        assert line["created_at"].endswith("Z")
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "stop"
    assert final["message"] == {"role": "assistant", "content": ""}
    for key in (
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ):
        assert isinstance(final[key], int), key
    assert (final["prompt_eval_count"], final["eval_count"]) == (2, 3)


def test_generate_ndjson_and_single_object(node: RunningNode) -> None:
    streamed = httpx.post(
        f"{node.url}/api/generate", json={"model": "scripted-echo", "prompt": "hi"}
    )
    lines = [json.loads(line) for line in streamed.text.splitlines()]
    assert [line["response"] for line in lines] == ["echo:", " hi", ""]
    single = httpx.post(
        f"{node.url}/api/generate",
        json={"model": "scripted-echo", "prompt": "hi", "stream": False},
    )
    assert single.headers["content-type"].startswith("application/json")
    body = single.json()
    assert body["response"] == "echo: hi" and body["done"] is True and body["eval_count"] == 2
