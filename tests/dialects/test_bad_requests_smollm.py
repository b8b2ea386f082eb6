"""Bad sampling values against a real SmolLM2 runner: each is a 400 in its dialect's shape that
names the field, while a stream already running on the same runner finishes normally and the
runner process is the same one afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.waiting import wait_until
from exo_engine_mlx.runner import MlxRunner

from .support import DIALECTS
from .test_smollm import _mlx_plugin, _pick

pytestmark = [pytest.mark.smollm, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Count from one to fifty in words."}]
MANY_STOPS = [f"stop{i}" for i in range(10_000)]

Body = Callable[[str], dict[str, Any]]
# (route, body builder, the field the refusal names, where the dialect puts its message)
CASES: list[tuple[str, str, Body, str]] = [
    ("openai seed", "/v1/chat/completions", lambda m: {"model": m, "messages": HELLO, "seed": -1}, "seed"),
    ("openai min_p", "/v1/chat/completions", lambda m: {"model": m, "messages": HELLO, "min_p": 5}, "min_p"),
    ("openai penalty", "/v1/chat/completions", lambda m: {"model": m, "messages": HELLO, "repetition_penalty": -1}, "repetition_penalty"),
    ("openai max_tokens", "/v1/chat/completions", lambda m: {"model": m, "messages": HELLO, "max_tokens": 10**30}, "max_tokens"),
    ("openai top_k", "/v1/chat/completions", lambda m: {"model": m, "messages": HELLO, "top_k": -1}, "top_k"),
    ("responses temperature", "/v1/responses", lambda m: {"model": m, "input": "hi", "temperature": -1}, "temperature"),
    ("responses max_output_tokens", "/v1/responses", lambda m: {"model": m, "input": "hi", "max_output_tokens": 2**63}, "max_output_tokens"),
    ("anthropic stop_sequences", "/v1/messages", lambda m: {"model": m, "max_tokens": 8, "messages": HELLO, "stop_sequences": MANY_STOPS}, "stop_sequences"),
    ("anthropic max_tokens", "/v1/messages", lambda m: {"model": m, "max_tokens": 10**30, "messages": HELLO}, "max_tokens"),
    ("anthropic top_k", "/v1/messages", lambda m: {"model": m, "max_tokens": 8, "messages": HELLO, "top_k": -3}, "top_k"),
    ("ollama chat seed", "/api/chat", lambda m: {"model": m, "messages": HELLO, "options": {"seed": -1}}, "options.seed"),
    ("ollama chat min_p", "/api/chat", lambda m: {"model": m, "messages": HELLO, "options": {"min_p": 5}}, "options.min_p"),
    ("ollama chat stop", "/api/chat", lambda m: {"model": m, "messages": HELLO, "options": {"stop": MANY_STOPS}}, "options.stop"),
    ("ollama generate penalty", "/api/generate", lambda m: {"model": m, "prompt": "hi", "options": {"repeat_penalty": -1}}, "options.repeat_penalty"),
    ("ollama generate num_predict", "/api/generate", lambda m: {"model": m, "prompt": "hi", "options": {"num_predict": 10**30}}, "options.num_predict"),
]  # fmt: skip


def message(path: str, body: dict[str, Any]) -> str:
    """The error message, from wherever the route's dialect puts it."""
    if path.startswith("/api/"):
        return body["error"]
    return body["error"]["message"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with running_node(tmp_path_factory.mktemp("bad"), [_mlx_plugin(), *DIALECTS]) as running:
        yield running


def runner_pids(node: RunningNode) -> list[int | None]:
    worker = node.node.worker
    assert worker is not None
    return [x.runner.pid for x in worker._locals.values() if isinstance(x.runner, MlxRunner)]


@pytest.mark.timeout(600)
def test_bad_values_are_400s_while_a_stream_on_the_runner_finishes(node: RunningNode) -> None:
    model = _pick(node.node).model_id
    warm = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={"model": model, "messages": HELLO, "max_tokens": 2},
        timeout=300,
    )
    assert warm.status_code == 200
    (pid,) = runner_pids(node)

    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": model, "messages": HELLO, "max_tokens": 120, "temperature": 0}
        with httpx.stream(
            "POST", f"{node.url}/v1/chat/completions", json={**body, "stream": True}, timeout=300
        ) as reply:
            for line in reply.iter_lines():
                lines.append(line)
                if '"content"' in line:
                    started.set()

    streaming = threading.Thread(target=stream)
    streaming.start()
    assert started.wait(120), "the stream did not start"
    for name, path, build, field in CASES:
        r = httpx.post(f"{node.url}{path}", json=build(model), timeout=60)
        assert r.status_code == 400, (name, r.text)
        assert message(path, r.json()).startswith(f"{field} "), (name, r.text)
    streaming.join(300)
    assert not streaming.is_alive()
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]", events[-3:]
    finish = [e for e in events if '"finish_reason":"' in e.replace(" ", "")]
    assert finish and ('"length"' in finish[-1] or '"stop"' in finish[-1]), events[-3:]
    assert not any('"error"' in line for line in lines)
    assert runner_pids(node) == [pid]
    wait_until(lambda: not node.node.state.tasks, timeout=10, interval=0.02)
