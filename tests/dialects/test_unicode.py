"""Multi-byte text (accents, CJK, emoji) crosses every dialect's framing intact."""

from __future__ import annotations

import json

import httpx
import pytest

from .support import Cluster

TEXT = "héllo 世界 🌍👋🏽"
USER = [{"role": "user", "content": TEXT}]

CASES = {
    "openai": (
        "/v1/chat/completions",
        {"model": "scripted-echo", "messages": USER, "stream": True},
    ),
    "claude": (
        "/v1/messages",
        {"model": "scripted-echo", "max_tokens": 20, "messages": USER, "stream": True},
    ),
    "ollama": ("/api/chat", {"model": "scripted-echo", "messages": USER}),
}


def _text(dialect: str, body: str) -> str:
    out = []
    for line in body.splitlines():
        if dialect == "openai" and line.startswith("data: {"):
            out.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        elif dialect == "claude" and line.startswith("data: "):
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta":
                out.append(event["delta"]["text"])
        elif dialect == "ollama" and line:
            out.append(json.loads(line)["message"]["content"])
    return "".join(out)


@pytest.mark.parametrize("dialect", list(CASES))
def test_multibyte_text_round_trips(cluster: Cluster, dialect: str) -> None:
    path, body = CASES[dialect]
    r = httpx.post(cluster.url + path, json=body)
    assert r.status_code == 200
    assert "\ufffd" not in r.text
    assert _text(dialect, r.text) == f"echo: {TEXT}"
