"""A small HTTP client for a running node's API, and the exit codes of the client commands."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

# What a client command's exit status says.
EXIT_OK = 0
EXIT_FAILED = 1  # the node refused, or the download / generation failed
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_UNREACHABLE = 3  # no node answered at --node
EXIT_NOT_FOUND = 4  # the model (or instance) is unknown to the cluster
EXIT_INTERRUPTED = 130  # Ctrl-C


# The SSE comment a node streams while it prefills a long prompt (see api_openai's chat).
_PREFILL = re.compile(r"^: ?prefill (\d+)/(\d+)")


@dataclass(frozen=True)
class Prefill:
    """`done` of `total` prompt tokens are prefilled (no answer token yet)."""

    done: int
    total: int


class ClientError(Exception):
    """A request that did not succeed; `exit_code` is what the command should exit with."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def _detail(response: httpx.Response) -> str:
    """The message of an error body in any of the node's shapes (native, OpenAI...)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "detail" in body:
            return str(body["detail"])
    return json.dumps(body)


class NodeClient:
    def __init__(self, url: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise ClientError(f"no exo node answers at {self.url}: {e}", EXIT_UNREACHABLE) from e
        if response.status_code >= 400:
            code = EXIT_NOT_FOUND if response.status_code == 404 else EXIT_FAILED
            raise ClientError(_detail(response), code)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream_chat(self, body: dict[str, Any]) -> Iterator[dict[str, Any] | Prefill]:
        """The `chat.completion.chunk` objects of a streamed chat completion, and the prefill
        progress of a long prompt before them."""
        try:
            with self._http.stream(
                "POST", "/v1/chat/completions", json={**body, "stream": True}, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ClientError(_detail(response))
                for line in response.iter_lines():
                    if prefill := _PREFILL.match(line):
                        yield Prefill(int(prefill[1]), int(prefill[2]))
                        continue
                    if not line.startswith("data:"):
                        continue  # keep-alive comments, blank lines
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise ClientError(str(chunk["error"].get("message", chunk["error"])))
                    yield chunk
        except httpx.TransportError as e:
            raise ClientError(f"the stream from {self.url} broke: {e}", EXIT_UNREACHABLE) from e
