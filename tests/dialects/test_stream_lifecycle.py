"""A client that leaves cancels its generation; a quiet generation keeps its stream alive.

Runs on the slow node: tokens every 0.2 s and keep-alives after 0.1 s of silence.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from exo_core.testing.waiting import wait_until

from .support import Cluster

LONG = " ".join(f"w{i}" for i in range(40))  # about 8 s of output at 0.2 s a token
USER = [{"role": "user", "content": LONG}]

STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": (
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "stream": True},
    ),
    "openai-responses": (
        "/v1/responses",
        {"model": "scripted-echo", "input": LONG, "stream": True},
    ),
    "claude": (
        "/v1/messages",
        {"model": "scripted-echo", "max_tokens": 100, "messages": USER, "stream": True},
    ),
    "ollama-chat": ("/api/chat", {"model": "scripted-echo", "messages": USER}),
    "ollama-generate": ("/api/generate", {"model": "scripted-echo", "prompt": LONG}),
}


def _assert_cancelled(cluster: Cluster, before: int) -> None:
    wait_until(
        lambda: cluster.cancellations() > before, timeout=5, interval=0.02
    )  # the runner saw it
    wait_until(lambda: cluster.tasks() == 0, timeout=5, interval=0.02)  # the task left the state


@pytest.mark.parametrize("dialect", list(STREAMS))
def test_disconnect_mid_stream_cancels(slow_cluster: Cluster, dialect: str) -> None:
    path, body = STREAMS[dialect]
    before = slow_cluster.cancellations()
    with (
        httpx.Client(base_url=slow_cluster.url, timeout=10) as client,
        client.stream("POST", path, json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():  # a few tokens of real output, then hang up
            if '" w2"' in line:
                break
        assert slow_cluster.tasks() == 1
    _assert_cancelled(slow_cluster, before)


NON_STREAMED: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": ("/v1/chat/completions", {"model": "scripted-echo", "messages": USER}),
    "claude": ("/v1/messages", {"model": "scripted-echo", "max_tokens": 100, "messages": USER}),
    "ollama-chat": ("/api/chat", {"model": "scripted-echo", "messages": USER, "stream": False}),
}


@pytest.mark.parametrize("dialect", list(NON_STREAMED))
def test_disconnect_while_waiting_cancels(slow_cluster: Cluster, dialect: str) -> None:
    path, body = NON_STREAMED[dialect]
    before = slow_cluster.cancellations()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow_cluster.url + path, json=body, timeout=0.6)
    _assert_cancelled(slow_cluster, before)


KEEPALIVE = {
    "openai-chat": ": keep-alive",
    "openai-responses": ": keep-alive",
    "claude": "event: ping",
    "ollama-chat": '"content":""',
    "ollama-generate": '"response":""',
}


@pytest.mark.parametrize("dialect", list(STREAMS))
def test_keep_alive_while_quiet(slow_cluster: Cluster, dialect: str) -> None:
    path, body = STREAMS[dialect]
    short = {**body}
    short.update({"messages": [{"role": "user", "content": "a"}]} if "messages" in body else {})
    short.update({"input": "a"} if "input" in body else {})
    short.update({"prompt": "a"} if "prompt" in body else {})
    r = httpx.post(slow_cluster.url + path, json=short, timeout=10)
    assert r.status_code == 200
    assert KEEPALIVE[dialect] in r.text
    assert "echo:" in r.text
    if dialect == "claude":
        # Beyond the ping Anthropic sends after message_start.
        assert r.text.count("event: ping") >= 2
