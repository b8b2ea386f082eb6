"""Bad input gets a 4xx in the dialect's own error shape, and the node keeps serving."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from .support import Cluster

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
USER = [{"role": "user", "content": "hi"}]

Case = tuple[str, str, Any, int]  # method, path, body (text is sent as is), status

OPENAI: list[Case] = [
    ("POST", "/v1/chat/completions", "{not json", 400),
    ("POST", "/v1/chat/completions", "[]", 400),
    ("POST", "/v1/chat/completions", {"model": "nope", "messages": USER}, 404),
    ("POST", "/v1/chat/completions", {"model": "scripted-echo", "messages": []}, 400),
    ("POST", "/v1/chat/completions", {"model": "scripted-echo", "messages": "x"}, 400),
    ("POST", "/v1/chat/completions", {"messages": USER}, 400),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "temperature": "hot"},
        400,
    ),
    ("POST", "/v1/chat/completions", {"model": "scripted-echo", "messages": USER, "n": 2}, 400),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": [{"role": "wizard", "content": "x"}]},
        400,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {
            "model": "scripted-echo",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    ],
                }
            ],
        },
        400,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "frequency_penalty": 2.5},
        400,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "response_format": {"type": "json_object"}},
        400,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "temperature": -1},
        400,
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "tools": [{"type": "web_search"}]},
        400,
    ),
    ("POST", "/v1/responses", "{", 400),
    ("POST", "/v1/responses", {"model": "nope", "input": "hi"}, 404),
    ("POST", "/v1/responses", {"model": "scripted-echo", "input": []}, 400),
    ("POST", "/v1/responses", {"model": "scripted-echo", "input": 5}, 400),
    (
        "POST",
        "/v1/responses",
        {"model": "scripted-echo", "input": "hi", "previous_response_id": "resp_1"},
        400,
    ),
    ("POST", "/v1/responses", {"model": "scripted-echo", "input": [{"type": "mystery"}]}, 400),
    (
        "POST",
        "/v1/responses",
        {
            "model": "scripted-echo",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}
                    ],
                }
            ],
        },
        400,
    ),
    ("GET", "/v1/models/nope", None, 404),
    ("GET", "/v1/chat/completions", None, 405),
    ("DELETE", "/v1/models", None, 405),
    ("GET", "/v1/embeddings", None, 404),
    ("POST", "/v1/completions", {"model": "scripted-echo", "prompt": "x"}, 404),
]

CLAUDE: list[Case] = [
    ("POST", "/v1/messages", "{not json", 400),
    ("POST", "/v1/messages", {"model": "nope", "max_tokens": 5, "messages": USER}, 404),
    ("POST", "/v1/messages", {"model": "scripted-echo", "max_tokens": 5, "messages": []}, 400),
    ("POST", "/v1/messages", {"model": "scripted-echo", "max_tokens": 5, "messages": "x"}, 400),
    ("POST", "/v1/messages", {"model": "scripted-echo", "messages": USER}, 400),
    (
        "POST",
        "/v1/messages",
        {"model": "scripted-echo", "max_tokens": 5, "messages": USER, "temperature": "hot"},
        400,
    ),
    ("POST", "/v1/messages", {"model": "scripted-echo", "max_tokens": 0, "messages": USER}, 400),
    (
        "POST",
        "/v1/messages",
        {
            "model": "scripted-echo",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        }
                    ],
                }
            ],
        },
        400,
    ),
    (
        "POST",
        "/v1/messages",
        {
            "model": "scripted-echo",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        },
        400,
    ),
    (
        "POST",
        "/v1/messages",
        {
            "model": "scripted-echo",
            "max_tokens": 5,
            "messages": USER,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        400,
    ),
    (
        "POST",
        "/v1/messages",
        {
            "model": "scripted-echo",
            "max_tokens": 5,
            "messages": USER,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        400,
    ),
    ("POST", "/v1/messages/count_tokens", {"model": "nope", "messages": USER}, 404),
    ("POST", "/v1/messages/count_tokens", {"model": "scripted-echo", "messages": 3}, 400),
    ("GET", "/v1/messages", None, 405),
    ("POST", "/v1/messages/batches", {}, 404),
]

OLLAMA: list[Case] = [
    ("POST", "/api/chat", "{not json", 400),
    ("POST", "/api/chat", {"model": "nope", "messages": USER}, 404),
    ("POST", "/api/chat", {"model": "scripted-echo", "messages": "x"}, 400),
    (
        "POST",
        "/api/chat",
        {"model": "scripted-echo", "messages": USER, "options": {"temperature": "hot"}},
        400,
    ),
    (
        "POST",
        "/api/chat",
        {"model": "scripted-echo", "messages": [{"role": "user", "content": "x", "images": [PNG]}]},
        400,
    ),
    ("POST", "/api/chat", {"model": "scripted-echo", "messages": USER, "format": "json"}, 400),
    ("POST", "/api/chat", {"model": "scripted-echo", "messages": USER, "think": True}, 400),
    (
        "POST",
        "/api/chat",
        {"model": "scripted-echo", "messages": USER, "options": {"mirostat": 2}},
        400,
    ),
    ("POST", "/api/chat", {"model": "scripted-echo", "keep_alive": 0}, 400),
    ("POST", "/api/generate", "{", 400),
    ("POST", "/api/generate", {"model": "nope", "prompt": "x"}, 404),
    ("POST", "/api/generate", {"model": "scripted-echo", "prompt": 3}, 400),
    ("POST", "/api/generate", {"model": "scripted-echo", "prompt": "x", "suffix": "y"}, 400),
    ("POST", "/api/show", {"model": "nope"}, 404),
    ("POST", "/api/show", {}, 400),
    ("GET", "/api/chat", None, 405),
    ("POST", "/api/tags", {}, 405),
    ("POST", "/api/pull", {"model": "x"}, 404),
    ("POST", "/ollama/api/chat", {"model": "nope", "messages": USER}, 404),
    ("GET", "/ollama/api/nothing", None, 404),
]


def _send(cluster: Cluster, method: str, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, str) else None if body is None else json.dumps(body)
    headers = {"content-type": "application/json"} if content is not None else {}
    return httpx.request(method, cluster.url + path, content=content, headers=headers)


def _openai_shape(body: Any) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] in ("invalid_request_error", "server_error")


def _claude_shape(body: Any) -> None:
    assert body["type"] == "error"
    assert body["error"]["type"] in ("invalid_request_error", "not_found_error")
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def _ollama_shape(body: Any) -> None:
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]


def _check(cluster: Cluster, case: Case, shape: Callable[[Any], None]) -> None:
    method, path, body, status = case
    r = _send(cluster, method, path, body)
    assert r.status_code == status, r.text
    shape(r.json())


@pytest.mark.parametrize("case", OPENAI, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:60]}")
def test_openai_errors(cluster: Cluster, case: Case) -> None:
    _check(cluster, case, _openai_shape)


@pytest.mark.parametrize("case", CLAUDE, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:60]}")
def test_claude_errors(cluster: Cluster, case: Case) -> None:
    _check(cluster, case, _claude_shape)


@pytest.mark.parametrize("case", OLLAMA, ids=lambda c: f"{c[0]} {c[1]} {str(c[2])[:60]}")
def test_ollama_errors(cluster: Cluster, case: Case) -> None:
    _check(cluster, case, _ollama_shape)


def test_specific_details(cluster: Cluster) -> None:
    missing = _send(cluster, "POST", "/v1/chat/completions", {"model": "nope", "messages": USER})
    assert missing.json()["error"]["code"] == "model_not_found"
    typed = _send(
        cluster, "POST", "/v1/chat/completions", {"model": "scripted-echo", "messages": "x"}
    )
    assert "$.messages" in typed.json()["error"]["message"]
    claude = _send(
        cluster, "POST", "/v1/messages", {"model": "nope", "max_tokens": 5, "messages": USER}
    )
    assert claude.json()["error"]["type"] == "not_found_error"


def test_still_serving_after_errors(cluster: Cluster) -> None:
    for case in (*OPENAI, *CLAUDE, *OLLAMA):
        _send(cluster, *case[:3])
    good = [
        ("/v1/chat/completions", {"model": "scripted-echo", "messages": USER}),
        ("/v1/responses", {"model": "scripted-echo", "input": "hi"}),
        ("/v1/messages", {"model": "scripted-echo", "max_tokens": 5, "messages": USER}),
        ("/api/chat", {"model": "scripted-echo", "messages": USER, "stream": False}),
    ]
    for path, body in good:
        r = httpx.post(cluster.url + path, json=body)
        assert r.status_code == 200, r.text
        assert "echo: hi" in r.text
