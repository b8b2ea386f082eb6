"""Capture the exact HTTP requests the official Python clients (openai, anthropic, ollama, as
installed in this workspace) send, into tests/dialects/fixtures/clients/*_python.json.

    uv run --locked python scripts/capture_client_fixtures.py

Each client talks to a small recording server here that keeps every request (method, path,
headers, body) and answers with the least that lets the call end; what a client makes of that
answer does not matter (the request is already recorded). Each recorded request gets the
`expect` of its scenario below, which `tests/dialects/test_client_fixtures.py` checks when it
replays the request against a real node (the scripted engine's models).

The clients exo users run that are not Python packages (Claude Code, opencode, Codex, n8n,
VS Code Copilot: npm or editor extensions, and npm is out of reach here) cannot be captured
this way: their fixtures are written from their documented and observed request shapes.
"""

from __future__ import annotations

import importlib.metadata
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "dialects" / "fixtures" / "clients"
# Secrets, and what the replaying HTTP client sets itself.
LEFT_OUT = {
    "host",
    "content-length",
    "connection",
    "accept-encoding",
    "authorization",
    "x-api-key",
}
TOOL = {
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}


class Recorder(BaseHTTPRequestHandler):
    recorded: list[dict[str, Any]] = []

    def _record(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() not in LEFT_OUT}
        entry: dict[str, Any] = {"method": self.command, "path": self.path, "headers": headers}
        if body is not None:
            entry["body"] = body
        self.recorded.append(entry)
        streamed = isinstance(body, dict) and body.get("stream") is True
        if streamed and not self.path.startswith("/ollama/api/"):
            answer, kind = b"data: [DONE]\n\n", "text/event-stream"
        else:
            answer, kind = b"{}", "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = do_HEAD = _record

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def recording_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def capture(call: Callable[[], Any]) -> dict[str, Any]:
    """The one request `call` sends (its outcome against the recorder is ignored)."""
    before = len(Recorder.recorded)
    try:
        result = call()
        if hasattr(result, "__iter__") and not isinstance(result, dict | list | str):
            for _ in result:
                pass
    except Exception:
        pass  # the canned answer may not satisfy the client: the request is what we keep
    sent = Recorder.recorded[before:]
    assert len(sent) == 1, f"expected one request, got {sent}"
    return sent[0]


def openai_scenarios(url: str) -> list[tuple[Callable[[], Any], dict[str, Any]]]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-capture", max_retries=0)
    # The clients' TypedDicts want literals; plain dicts are what people pass.
    user: Any = [{"role": "user", "content": "Quito"}]
    hi: Any = [{"role": "user", "content": "hi"}]
    chat_tools: Any = [{"type": "function", "function": TOOL}]
    response_tools: Any = [{"type": "function", **TOOL}]
    return [
        (
            lambda: client.models.list(),
            {"status": 200, "json": {"data": "list>0"}},
        ),
        (
            lambda: client.chat.completions.create(
                model="scripted-echo", messages=user, max_tokens=16, temperature=0
            ),
            {"status": 200, "json": {"object": "chat.completion"}},
        ),
        (
            lambda: client.chat.completions.create(
                model="scripted-echo",
                messages=user,
                tools=chat_tools,
                stream=True,
                stream_options={"include_usage": True},
            ),
            {"status": 200, "stream": "sse", "checks": ["openai_tool_call_deltas"]},
        ),
        (
            lambda: client.chat.completions.create(
                model="scripted-thinker", messages=hi, stream=True
            ),
            {
                "status": 200,
                "stream": "sse",
                "checks": ["openai_reasoning_deltas", "no_null_in_deltas"],
            },
        ),
        (
            lambda: client.responses.create(
                model="scripted-echo", input="Quito", tools=response_tools
            ),
            {"status": 200, "checks": ["responses_function_call"]},
        ),
    ]


def anthropic_scenarios(url: str) -> list[tuple[Callable[[], Any], dict[str, Any]]]:
    client = anthropic.Anthropic(base_url=url, api_key="sk-capture", max_retries=0)
    system = "You are terse."
    user: Any = [{"role": "user", "content": "hello"}]
    return [
        (
            lambda: client.messages.create(
                model="scripted-echo", max_tokens=64, system=system, messages=user
            ),
            {"status": 200, "json": {"type": "message", "role": "assistant"}},
        ),
        (
            lambda: client.messages.create(
                model="scripted-echo", max_tokens=64, system=system, messages=user, stream=True
            ),
            {"status": 200, "stream": "sse", "checks": ["anthropic_stream"]},
        ),
        (
            lambda: client.messages.count_tokens(
                model="scripted-echo", system=system, messages=user
            ),
            {"status": 200, "json": {"input_tokens": "int>0"}},
        ),
    ]


def ollama_scenarios(url: str) -> list[tuple[Callable[[], Any], dict[str, Any]]]:
    client = ollama.Client(host=f"{url}/ollama")
    return [
        (lambda: client.list(), {"status": 200, "json": {"models": "list>0"}}),
        (
            lambda: client.show("scripted-echo"),
            {"status": 200, "checks": ["ollama_show_capabilities"]},
        ),
        (
            lambda: client.chat(
                model="scripted-echo",
                messages=[{"role": "user", "content": "hello"}],
                stream=False,
            ),
            {"status": 200, "json": {"done": True, "message": {"role": "assistant"}}},
        ),
    ]


CLIENTS = {
    "openai": ("the official openai Python client", openai_scenarios),
    "anthropic": ("the official anthropic Python client", anthropic_scenarios),
    "ollama": ("the official ollama Python client", ollama_scenarios),
}


def main() -> None:
    with recording_server() as url:
        for package, (name, scenarios) in CLIENTS.items():
            version = importlib.metadata.version(package)
            requests = [{**capture(call), "expect": expect} for call, expect in scenarios(url)]
            fixture = {
                "client": f"{name} {version}",
                "what": f"the requests {package}'s calls send, exactly as captured",
                "source": "captured by scripts/capture_client_fixtures.py",
                "requests": requests,
            }
            path = FIXTURES / f"{package}_python.json"
            path.write_text(json.dumps(fixture, indent=2) + "\n")
            print(f"{path.relative_to(FIXTURES.parents[3])}: {len(requests)} requests")


if __name__ == "__main__":
    main()
