"""Just enough WebDriver BiDi to drive Debian's Firefox ESR from a test.

Playwright drives only its own patched Firefox, and Selenium needs geckodriver (not in Debian),
so the test talks BiDi, the W3C protocol Firefox serves itself (`--remote-debugging-port`),
over one WebSocket: open a tab, size it, load a page, evaluate scripts, collect console logs.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from websockets.sync.client import ClientConnection, connect

from exo_core.testing.harness import free_port


class BidiError(RuntimeError):
    pass


@dataclass
class Firefox:
    socket: ClientConnection
    context: str = ""
    logs: list[dict[str, Any]] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        command_id = next(self._ids)
        self.socket.send(json.dumps({"id": command_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("type") == "event":
                if message["method"] == "log.entryAdded":
                    self.logs.append(message["params"])
                continue
            if message.get("id") != command_id:
                continue
            if message.get("type") == "error":
                raise BidiError(f"{method}: {message.get('error')}: {message.get('message')}")
            return message["result"]

    def open(self, url: str, width: int, height: int) -> None:
        self.call(
            "browsingContext.setViewport",
            context=self.context,
            viewport={"width": width, "height": height},
        )
        self.call("browsingContext.navigate", context=self.context, url=url, wait="complete")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "script.evaluate",
            expression=expression,
            target={"context": self.context},
            awaitPromise=True,
        )
        if result.get("type") == "exception":
            raise BidiError(result["exceptionDetails"]["text"])
        return _value(result["result"])

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression}")
            time.sleep(0.2)

    def errors(self) -> list[str]:
        self.evaluate("0")  # drains the events received so far
        return [f"{e.get('type')}: {e.get('text')}" for e in self.logs if e.get("level") == "error"]


def _value(remote: dict[str, Any]) -> Any:
    kind = remote.get("type")
    if kind in ("string", "number", "boolean"):
        return remote["value"]
    if kind == "array":
        return [_value(v) for v in remote.get("value", [])]
    if kind == "object":
        return {k: _value(v) for k, v in remote.get("value", [])}
    return None


def firefox_path() -> str | None:
    return shutil.which("firefox-esr") or shutil.which("firefox")


@contextmanager
def firefox() -> Iterator[Firefox]:
    executable = firefox_path()
    assert executable is not None, "no Firefox"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="exo-firefox-") as profile:
        process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-remote",
                "--profile",
                profile,
                f"--remote-debugging-port={port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            socket = _connect(f"ws://127.0.0.1:{port}/session", process)
            with socket:
                browser = Firefox(socket)
                browser.call("session.new", capabilities={})
                browser.call("session.subscribe", events=["log.entryAdded"])
                tree = browser.call("browsingContext.getTree")
                browser.context = tree["contexts"][0]["context"]
                yield browser
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _connect(url: str, process: subprocess.Popen[bytes]) -> ClientConnection:
    deadline = time.monotonic() + 60
    while True:
        try:
            return connect(url, open_timeout=5, max_size=None)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.3)
