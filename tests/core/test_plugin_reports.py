"""Plugin failures say whose they are: a route clash names the plugin that took the path and
the one left out; an engine's failure names the engine. (`exo plugins` running the start-up
hooks is in test_plugins.py, with real installed packages.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import get

from exo_core import worker
from exo_core.api.routes_check import accepted_routes
from exo_core.config import NodeConfig
from exo_core.events import RunnerStatusChanged
from exo_core.plugin_check import OfflineContext, trial_app
from exo_core.plugin_host import PluginHost, new_plugin_manager
from exo_core.state import RunnerStatus
from exo_core.testing.harness import running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@get("/shared")
async def first_shared() -> str:
    return "first"


@get("/shared")
async def second_shared() -> str:
    return "second"


@get("/own")
async def own() -> str:
    return "own"


@get("/state")
async def not_the_state() -> str:
    return "mine"


@get("/unannotated")
async def unannotated():  # type: ignore[no-untyped-def]  # Litestar refuses: no return type
    return "x"


def _accept(contributed: list[tuple[str, list[Any]]]) -> tuple[PluginHost, list[Any]]:
    host = PluginHost(new_plugin_manager())
    ctx = OfflineContext(NodeConfig())
    return host, accepted_routes(host, contributed, lambda handlers: trial_app(ctx, handlers))


def test_a_route_clash_leaves_out_the_later_plugin_and_names_the_one_that_took_the_path() -> None:
    host, accepted = _accept([("taker", [first_shared]), ("late", [second_shared, own])])
    assert accepted == [first_shared]
    [failure] = host.failures
    assert failure.name == "late" and failure.hook == "exo_routes"
    assert "GET /shared is served by plugin taker already" in failure.error
    assert any(
        w.startswith("plugin taker: took GET /shared first") and "late" in w for w in host.warnings
    )


def test_a_route_the_core_serves_is_refused_naming_the_core() -> None:
    host, accepted = _accept([("shadow", [not_the_state]), ("fine", [own])])
    assert accepted == [own]
    [failure] = host.failures
    assert failure.name == "shadow" and "GET /state is served by the core already" in failure.error
    assert host.warnings == []


def test_a_plugin_whose_handler_litestar_refuses_is_left_out_with_litestars_reason() -> None:
    host, accepted = _accept([("sloppy", [unannotated]), ("fine", [own])])
    assert accepted == [own]
    [failure] = host.failures
    assert failure.name == "sloppy" and "ImproperlyConfiguredException" in failure.error


def test_an_engine_message_names_the_engine_once() -> None:
    assert worker.from_engine("mlx", "out of memory") == "engine mlx: out of memory"
    assert worker.from_engine("mlx", "engine mlx: out of memory") == "engine mlx: out of memory"
    assert worker.from_engine("", "out of memory") == "out of memory"
    assert worker.from_engine("mlx", None) is None


def test_a_runner_that_fails_to_load_reports_the_engine_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "BACKOFF_BASE_S", 0.05)
    with running_node(tmp_path, [ScriptedEnginePlugin(fail_load=True)]) as node:
        httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}).raise_for_status()

        def errors() -> list[str]:
            return [
                e.event.runner.error or ""
                for e in node.node.replica.log
                if isinstance(e.event, RunnerStatusChanged)
                and e.event.runner.status == RunnerStatus.FAILED
            ]

        deadline = time.monotonic() + 15
        while not errors():
            assert time.monotonic() < deadline, "no runner failed"
            time.sleep(0.05)
        assert errors()[0].startswith("engine scripted: ")
        assert "scripted load failure" in errors()[0]
