"""`exo new-plugin NAME --kind route|engine|observer|transport`: a plugin package to start from.

It writes `exo-NAME/` with a pyproject (entry point, the exo-core range the plugin API allows),
a working example of the kind and a test that runs it in a real node with `exo_core.testing`.
The examples follow docs/plugins.md.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from string import Template

KINDS = ("route", "engine", "observer", "transport")

#: The exo-core versions that carry the plugin API major version of this exo-core.
CORE_RANGE = "exo-core>=0.2,<0.3"
CORE_TESTING = "exo-core[testing]>=0.2,<0.3"

PYPROJECT = """\
[project]
name = "exo-$name"
version = "0.1.0"
description = "An exo plugin ($kind)"
requires-python = ">=3.11"
dependencies = ["$core_range"]

[project.optional-dependencies]
# exo_core.testing's own needs (pytest, httpx, hypothesis): `pip install -e '.[test]'`.
test = ["$core_testing"]

[project.entry-points."exo.plugins"]
$name = "exo_$name.plugin"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["exo_$name"]
"""

ROUTE = '''\
"""The $name plugin: one HTTP route."""

from litestar import get

from exo_core.plugin import InjectedNode, NodeContext, hookimpl


@get("/$name")
async def hello(node: InjectedNode) -> dict[str, object]:
    return {"plugin": "$name", "node": node.node_id, "models": len(node.cards())}


@hookimpl
def exo_routes(ctx: NodeContext) -> list[object]:
    return [hello]
'''

ROUTE_TEST = """\
from pathlib import Path

import httpx

from exo_$name import plugin
from exo_core.testing import running_node


def test_the_route_answers(tmp_path: Path) -> None:
    with running_node(tmp_path, plugins=[plugin]) as node:
        body = httpx.get(f"{node.url}/$name").json()
        assert body["plugin"] == "$name" and body["node"] == node.node_id
"""

ENGINE = '''\
"""The $name plugin: an engine that echoes the user's last message, and its model card."""

from collections.abc import AsyncIterator

import anyio

from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    ModelCard,
    ModelId,
    NodeConfig,
    RunnerStatus,
    Task,
    TaskId,
    TextChunk,
    Usage,
    hookimpl,
)
from exo_core.plugin.engine import Engine, Runner, RunnerSpec, StatusReporter

CARD = ModelCard(model_id=ModelId("$name"), family="$name", source="$name:", storage_size_bytes=0)


class EchoRunner(Runner):
    def __init__(self) -> None:
        self._stopped = anyio.Event()
        self._cancelled: set[TaskId] = set()

    async def serve(self, report: StatusReporter) -> None:
        report(RunnerStatus.LOADING, None)
        report(RunnerStatus.READY, None)
        await self._stopped.wait()

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        if self._stopped.is_set():
            yield ErrorChunk(task_id=task.task_id, message="the runner is stopped")
            return
        user = [m.text() for m in task.params.messages if m.role == "user"]
        words = (user[-1] if user else task.params.prompt or "").split()
        limit = task.params.max_tokens or len(words)
        reason = FinishReason.STOP if limit >= len(words) else FinishReason.LENGTH
        sent = 0
        for i, word in enumerate(words[:limit]):
            if task.task_id in self._cancelled:
                reason = FinishReason.CANCELLED
                break
            yield TextChunk(task_id=task.task_id, text=word if i == 0 else " " + word)
            sent += 1
            await anyio.sleep(0)
        usage = Usage(prompt_tokens=len(words), completion_tokens=sent)
        yield FinishChunk(task_id=task.task_id, finish_reason=reason, usage=usage)

    async def cancel(self, task_id: TaskId) -> None:
        self._cancelled.add(task_id)

    async def stop(self) -> None:
        self._stopped.set()


class EchoEngine(Engine):
    name = "$name"
    needs_download = False  # echo needs no weights: the downloader is never asked

    def can_serve(self, card: ModelCard) -> bool:
        return card.source == "$name:"

    def create_runner(self, spec: RunnerSpec) -> Runner:
        return EchoRunner()


@hookimpl
def exo_engines(config: NodeConfig) -> list[Engine]:
    return [EchoEngine()]


@hookimpl
def exo_model_cards(config: NodeConfig) -> list[ModelCard]:
    return [CARD]
'''

ENGINE_TEST = """\
from pathlib import Path

import httpx
import pytest

from exo_$name import plugin
from exo_core.testing import running_node
from exo_core.testing.engine_conformance import *  # noqa: F403
from exo_core.testing.engine_conformance import EngineCase


@pytest.fixture
def engine_case(tmp_path: Path) -> EngineCase:
    # For the engine conformance suite imported above.
    return EngineCase(engine=plugin.EchoEngine(), card=plugin.CARD, model_path=tmp_path)


def test_the_engine_answers_through_an_api_dialect(tmp_path: Path) -> None:
    with running_node(tmp_path, plugins=[plugin]) as node:
        reply = httpx.post(
            f"{node.url}/v1/chat/completions",
            json={"model": "$name", "messages": [{"role": "user", "content": "hello there"}]},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "hello there"
"""

OBSERVER = '''\
"""The $name plugin: counts the events this node applies, by type, and serves the counts."""

from collections import Counter

from litestar import get

from exo_core.plugin import IndexedEvent, InjectedNode, NodeContext, State, hookimpl

# Per node id: one process may run several nodes (tests do).
SEEN: dict[str, Counter[str]] = {}


@hookimpl
def exo_event_applied(event: IndexedEvent, state: State, ctx: NodeContext) -> None:
    # Called on the node's event loop for every event: return quickly (use ctx.spawn for more).
    SEEN.setdefault(ctx.node_id, Counter())[type(event.event).__name__] += 1


@get("/$name")
async def counts(node: InjectedNode) -> dict[str, int]:
    return dict(SEEN.get(node.node_id, Counter()))


@hookimpl
def exo_routes(ctx: NodeContext) -> list[object]:
    return [counts]
'''

OBSERVER_TEST = """\
from pathlib import Path

import httpx

from exo_$name import plugin
from exo_core.testing import running_node


def test_the_observer_counts_applied_events(tmp_path: Path) -> None:
    with running_node(tmp_path, plugins=[plugin]) as node:
        counts = httpx.get(f"{node.url}/$name").json()
        assert counts.get("MasterElected", 0) >= 1 and counts.get("NodeTelemetry", 0) >= 1
"""

TRANSPORT = '''\
"""The $name plugin: a transport. This one has no peers (the node runs alone): fill in
`publish`, `request` and the events to reach other nodes, and run the transport conformance
suite (`exo_core.testing.transport_conformance`) against it."""

import uuid
from collections.abc import AsyncIterator

import anyio

from exo_core.plugin import NodeConfig, hookimpl
from exo_core.plugin.transport import RequestFailed, RequestHandler, Transport, TransportEvent


class LoneTransport(Transport):
    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._handler: RequestHandler | None = None
        self._send, self._receive = anyio.create_memory_object_stream[TransportEvent](100)

    @property
    def node_id(self) -> str:
        return self._node_id

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self._send.close()

    async def subscribe(self, topic: str) -> None:
        pass

    async def publish(self, topic: str, payload: bytes) -> None:
        pass  # no peers: a broadcast reaches no one (and never the sender itself)

    async def request(self, peer: str, payload: bytes, timeout: float = 10.0) -> bytes:
        raise RequestFailed(f"unknown peer {peer}")

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._handler = handler

    async def events(self) -> AsyncIterator[TransportEvent]:
        async for event in self._receive:
            yield event

    def peers(self) -> frozenset[str]:
        return frozenset()


@hookimpl
def exo_transport(config: NodeConfig) -> Transport | None:
    if config.transport not in ("", "$name"):
        return None  # another transport was chosen with --transport
    id_file = config.data_path / "$name-node-id"
    if not id_file.exists():
        config.data_path.mkdir(parents=True, exist_ok=True)
        id_file.write_text(f"node-{uuid.uuid4().hex[:16]}")
    return LoneTransport(id_file.read_text().strip())
'''

TRANSPORT_TEST = """\
from pathlib import Path

import httpx

from exo_$name import plugin
from exo_core.plugin import NodeConfig
from exo_core.testing import running_node


def test_a_node_runs_on_the_transport(tmp_path: Path) -> None:
    transport = plugin.exo_transport(NodeConfig(data_dir=str(tmp_path), transport="$name"))
    assert transport is not None
    with running_node(tmp_path, transport=transport) as node:
        health = httpx.get(f"{node.url}/healthz").json()
        assert health["master"] == transport.node_id == node.node_id
"""

TEMPLATES = {
    "route": (ROUTE, ROUTE_TEST),
    "engine": (ENGINE, ENGINE_TEST),
    "observer": (OBSERVER, OBSERVER_TEST),
    "transport": (TRANSPORT, TRANSPORT_TEST),
}


class ScaffoldError(ValueError):
    pass


def write_plugin(name: str, kind: str, parent: Path) -> Path:
    """Write the package `exo-NAME` under `parent` and return its directory."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ScaffoldError(f"'{name}' is not a plugin name: use lowercase letters, digits and _")
    if kind not in TEMPLATES:
        raise ScaffoldError(f"unknown kind '{kind}': one of {', '.join(KINDS)}")
    root = parent / f"exo-{name}"
    if root.exists():
        raise ScaffoldError(f"{root} exists already")
    code, test = TEMPLATES[kind]
    values = {"name": name, "kind": kind, "core_range": CORE_RANGE, "core_testing": CORE_TESTING}
    files = {
        "pyproject.toml": PYPROJECT,
        f"exo_{name}/__init__.py": "",
        f"exo_{name}/plugin.py": code,
        f"tests/test_{name}.py": test,
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values))
    return root


def add_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = subparsers.add_parser("new-plugin", help="write a plugin package to start from")
    sub.add_argument("name", help="the plugin's name (lowercase; the package is exo-NAME)")
    sub.add_argument("--kind", choices=KINDS, default="route", help="what the example does")
    sub.add_argument("--dir", default=".", help="where to write the package (default: here)")
    sub.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        root = write_plugin(args.name, args.kind, Path(args.dir))
    except ScaffoldError as e:
        print(f"exo new-plugin: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {root}: install it with `uv pip install -e '{root}[test]'` (add"
        " `--find-links DIR` for exo's built wheels: docs/plugins.md), test it with"
        f" `pytest {root}`"
    )
    return 0
