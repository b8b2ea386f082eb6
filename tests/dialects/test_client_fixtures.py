"""Replays the request shapes of the clients exo users run (fixtures/clients/*.json) against a
real node, and checks what each client is known to need from the answer.

The `*_python.json` fixtures are captured from the official Python clients by
`scripts/capture_client_fixtures.py` (run it again after upgrading a client); the others are
written by hand, their clients being out of reach here (each says so in its `source`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support import Cluster

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "clients").glob("*.json"))


def _requests() -> list[Any]:
    out = []
    for path in FIXTURES:
        fixture = json.loads(path.read_text())
        for i, request in enumerate(fixture["requests"]):
            out.append(pytest.param(request, id=f"{path.stem}-{i}"))
    return out


def sse_data(text: str) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body (comments, event lines and [DONE] left out)."""
    return [
        json.loads(line[5:].strip())
        for line in text.splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]


def _deltas(text: str) -> list[dict[str, Any]]:
    return [c["delta"] for frame in sse_data(text) for c in frame.get("choices", [])]


def no_null_in_deltas(text: str) -> None:
    deltas = _deltas(text)
    assert deltas
    for delta in deltas:
        assert all(v is not None for v in delta.values()), delta


def openai_tool_call_deltas(text: str) -> None:
    calls = [c for d in _deltas(text) for c in d.get("tool_calls", [])]
    assert calls, "no tool_calls delta"
    # The first delta of a call has its id, type and name; the rest only argument fragments
    # (as OpenAI streams them), which joined are the arguments.
    first, rest = calls[0], calls[1:]
    assert first["index"] == 0 and first["id"] and first["type"] == "function"
    assert first["function"]["name"] == "weather"
    for call in rest:
        assert call["index"] == 0 and set(call) == {"index", "function"}
        assert set(call["function"]) == {"arguments"}
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"query": "Quito"}
    finishes = [c["finish_reason"] for f in sse_data(text) for c in f.get("choices", [])]
    assert "tool_calls" in finishes
    assert any(f.get("usage") for f in sse_data(text)), "include_usage asked for usage"


def openai_reasoning_deltas(text: str) -> None:
    deltas = _deltas(text)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content", "") for d in deltas)
    assert reasoning.strip() == "pondering" and "<think>" not in content


def anthropic_stream(text: str) -> None:
    kinds = [e["type"] for e in sse_data(text)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds


def anthropic_pings(text: str) -> None:
    assert "ping" in [e["type"] for e in sse_data(text)]


def responses_function_call(body: Any) -> None:
    calls = [o for o in body["output"] if o["type"] == "function_call"]
    assert calls and calls[0]["name"] == "weather"
    assert json.loads(calls[0]["arguments"]) == {"query": "Quito"}


def bare_version(body: Any) -> None:
    assert set(body) == {"version"} and isinstance(body["version"], str)


def ollama_show_capabilities(body: Any) -> None:
    assert body["model_info"]["general.architecture"]
    assert "completion" in body["capabilities"] and "tools" in body["capabilities"]


CHECKS: dict[str, Callable[[Any], None]] = {
    f.__name__: f
    for f in (
        no_null_in_deltas,
        openai_tool_call_deltas,
        openai_reasoning_deltas,
        anthropic_stream,
        anthropic_pings,
        responses_function_call,
        bare_version,
        ollama_show_capabilities,
    )
}


def _matches(value: Any, want: Any) -> bool:
    if want == "int>0":
        return isinstance(value, int) and value > 0
    if want == "list>0":
        return isinstance(value, list) and len(value) > 0
    if isinstance(want, dict):
        return isinstance(value, dict) and all(_matches(value.get(k), w) for k, w in want.items())
    return value == want


@pytest.mark.parametrize("request_shape", _requests())
def test_client_request_shape(
    request_shape: dict[str, Any], cluster: Cluster, slow_cluster: Cluster
) -> None:
    target = slow_cluster if request_shape.get("slow") else cluster
    expect = request_shape["expect"]
    response = httpx.request(
        request_shape["method"],
        f"{target.url}{request_shape['path']}",
        headers=request_shape.get("headers", {}),
        json=request_shape.get("body"),
        timeout=30,
    )
    assert response.status_code == expect["status"], response.text
    streamed = expect.get("stream") == "sse"
    if streamed:
        assert response.headers["content-type"].startswith("text/event-stream")
    payload: Any = response.text if streamed else response.json()
    if "json" in expect:
        assert _matches(payload, expect["json"]), payload
    for name in expect.get("checks", []):
        CHECKS[name](payload)
