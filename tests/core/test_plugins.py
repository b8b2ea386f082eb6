"""Plugins found through entry points, end to end: a package made here, installed, then served.

The package is installed with `uv pip install --target` into a directory that only the `exo`
subprocess sees (through PYTHONPATH), so the workspace environment is left as it was and the
core never imports the plugin by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exo_core.testing.harness import free_port

PYPROJECT = """
[project]
name = "{dist}"
version = "1.2.3"
requires-python = ">=3.11"

[project.entry-points."exo.plugins"]
{name} = "{module}"

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""

GOOD = """
from litestar import get
from exo_core.hookspecs import hookimpl


@get("/hello-from-plugin")
async def hello(node: object) -> dict[str, str]:
    return {"hello": "plugin", "node": node.node_id}


@hookimpl
def exo_routes(ctx):
    return [hello]
"""

BROKEN = """
raise RuntimeError("this plugin is broken on purpose")
"""

# Loads, then fails in a start-up hook: left out of the running node.
BAD_ROUTES = """
from exo_core.plugin import hookimpl


@hookimpl
def exo_routes(ctx):
    raise RuntimeError("no routes today")
"""


# Serves the path `hello` serves: `hello` (called first: registered later) takes it.
CLASH = """
from litestar import get
from exo_core.plugin import hookimpl


@get("/hello-from-plugin")
async def same_path() -> str:
    return "clash"


@hookimpl
def exo_routes(ctx):
    return [same_path]
"""


def make_package(root: Path, dist: str, name: str, module: str, code: str) -> Path:
    pkg = root / dist
    (pkg / module).mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT.format(dist=dist, name=name, module=module))
    (pkg / module / "__init__.py").write_text(textwrap.dedent(code))
    return pkg


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plugins")
    good = make_package(root, "exo-hello", "hello", "exo_hello_plugin", GOOD)
    broken = make_package(root, "exo-broken", "broken", "exo_broken_plugin", BROKEN)
    bad_routes = make_package(root, "exo-bad-routes", "bad_routes", "exo_bad_routes", BAD_ROUTES)
    clash = make_package(root, "exo-clash", "clash", "exo_clash_plugin", CLASH)
    target = root / "site"
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(good),
            str(broken),
            str(bad_routes),
            str(clash),
        ],
        check=True,
        timeout=300,
    )
    return target


def exo(site: Path, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.Popen(
        [sys.executable, "-m", "exo_core.cli", *args],
        env=env,
        text=True,
        **popen,  # type: ignore[arg-type]
    )


def test_exo_plugins_lists_the_installed_plugin_and_the_broken_one(site: Path) -> None:
    proc = exo(site, "plugins", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "hello" in out and "exo-hello 1.2.3" in out and "exo_routes" in out
    assert "broken" in out and "FAILED TO LOAD" in out and "broken on purpose" in out


def test_disable_plugin_leaves_it_out(site: Path) -> None:
    proc = exo(site, "--disable-plugin", "hello", "plugins", stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert "exo-hello" not in out


@pytest.fixture
def served(site: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = exo(
        site,
        "--transport", "memory", "--api-port", str(port), "--data-dir", str(tmp_path / "data"),
        stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).json().get("master"):
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_plugin_route_is_served_and_the_broken_plugin_is_skipped(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    url, proc = served
    body = httpx.get(f"{url}/hello-from-plugin").json()
    assert body["hello"] == "plugin" and body["node"].startswith("node-")
    state = httpx.get(f"{url}/state").json()
    assert state["master"] is not None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "broken" in err and "skipped" in err
    assert "starting exo (pid" in err
    assert "stopped" in err


def test_a_plugin_left_out_by_a_startup_hook_is_listed_once_as_failed(
    served: tuple[str, subprocess.Popen[str]],
) -> None:
    url, _ = served
    body = httpx.get(f"{url}/plugins").json()
    loaded = [p["distribution"] for p in body["plugins"]]
    failed = [f["name"] for f in body["failed"]]
    assert "exo-hello" in loaded
    assert "exo-bad-routes" not in loaded  # pluggy keeps its distinfo after it is left out
    assert failed.count("bad_routes") == 1


def test_exo_plugins_runs_the_startup_hooks_and_agrees_with_get_plugins(
    site: Path, served: tuple[str, subprocess.Popen[str]]
) -> None:
    proc = exo(site, "plugins", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "bad_routes           FAILED in exo_routes: RuntimeError: no routes today" in out
    clash = "clash                FAILED in exo_routes: RouteClash: GET /hello-from-plugin"
    assert f"{clash} is served by plugin hello already" in out
    assert "warning: plugin hello: took GET /hello-from-plugin first" in out
    listed = {line.split()[0] for line in out.splitlines() if "FAILED" in line}
    body = httpx.get(f"{served[0]}/plugins").json()
    assert listed == {f["name"] for f in body["failed"]} == {"broken", "bad_routes", "clash"}
    loaded = {line.split()[0] for line in out.splitlines() if " hooks: " in line}
    assert loaded == {p["name"] for p in body["plugins"]}
    assert any("took GET /hello-from-plugin first" in w for w in body["warnings"])
