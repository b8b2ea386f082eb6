"""Plugins as their authors write them, in real `exo` processes.

The route, echo-engine and observer plugins come from docs/plugins.md (its code blocks are
extracted: a broken example fails here) and from `exo new-plugin`. Variants of them raise in
each hook they implement, and small plugins raise in every other hook. Everything is installed
with `uv pip install --target` into a directory only the `exo` processes see (PYTHONPATH).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from exo_core.scaffold import write_plugin
from exo_core.testing import ExoProcess, exo_processes
from exo_core.testing.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
BLOCK = re.compile(r"^```(\w+) ([^\n]*)\n(.*?)^```", re.S | re.M)

# The guide's plugins: distribution -> (entry point name, module, hooks it implements).
EXAMPLES = {
    "exo-hello": ("hello", "exo_hello", ["exo_routes"]),
    "exo-echo": ("echo", "exo_echo", ["exo_engines", "exo_model_cards"]),
    "exo-audit": ("audit", "exo_audit", ["exo_event_applied", "exo_routes"]),
}
# Hooks none of the examples implement, each raising in a plugin of its own.
OTHER_HOOKS = {
    "exo_add_cli_options": "parser",
    "exo_cli_commands": "subparsers",
    "exo_election_priority": "config",
    "exo_output_parsers": "",
    "exo_downloader": "config",
    "exo_transport": "config",
    "exo_place_instance": "card",
}
# Hooks called while the node runs: their plugin is logged, not left out.
RUNTIME_HOOKS = {"exo_event_applied", "exo_place_instance"}
SCAFFOLDED = {"np_route": "route", "np_engine": "engine", "np_observer": "observer"}


def guide_packages() -> dict[str, dict[str, str]]:
    """{distribution: {file: text}} from the guide's code blocks marked `package=... file=...`."""
    packages: dict[str, dict[str, str]] = {}
    for _, info, body in BLOCK.findall(GUIDE.read_text()):
        attrs = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
        if "package" in attrs:
            packages.setdefault(attrs["package"], {})[attrs["file"]] = body
    return packages


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def raising_variant(dist: str, files: dict[str, str], hook: str) -> tuple[str, dict[str, str]]:
    """The example renamed (its own module, entry point and route paths), with `hook` raising."""
    ep, module, _ = EXAMPLES[dist]
    name = f"bad_{ep}_{hook.removeprefix('exo_')}"
    out: dict[str, str] = {}
    for path, text in files.items():
        text = text.replace(module, f"exo_{name}")
        text = text.replace(f"{ep} = ", f"{name} = ").replace(
            f'name = "{dist}"', f'name = "{name}"'
        )
        text = re.sub(r'@get\("/(\w+)"\)', rf'@get("/\1-{name}")', text)
        out[path.replace(module, f"exo_{name}")] = text
    out[f"exo_{name}/plugin.py"] += (
        f"\n\n@hookimpl\ndef {hook}(*args, **kwargs):\n"
        f"    raise RuntimeError('{name} raised on purpose')\n"
    )
    return name, out


def lone_hook_plugin(hook: str, arg: str) -> tuple[str, dict[str, str]]:
    name = f"bad_{hook.removeprefix('exo_')}"
    code = (
        "from exo_core.plugin import hookimpl\n\n\n"
        # tryfirst: first-result hooks would not reach it after a built-in plugin's answer.
        f"@hookimpl(tryfirst=True)\ndef {hook}({arg}):\n"
        f"    raise RuntimeError('{name} raised on purpose')\n"
    )
    return name, _package(name, code)


def _package(name: str, code: str) -> dict[str, str]:
    pyproject = (
        f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
        f'[project.entry-points."exo.plugins"]\n{name} = "exo_{name}.plugin"\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        f'[tool.hatch.build.targets.wheel]\npackages = ["exo_{name}"]\n'
    )
    return {
        "pyproject.toml": pyproject,
        f"exo_{name}/__init__.py": "",
        f"exo_{name}/plugin.py": code,
    }


class Site:
    def __init__(self, path: Path, bad: dict[str, str], scaffolded: list[Path]) -> None:
        self.path = path
        #: the packages `exo new-plugin` wrote
        self.scaffolded = scaffolded
        #: plugin name -> the hook it raises in ("load" for an import failure)
        self.bad = bad

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.path)}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("authored")
    sources: list[Path] = []
    bad: dict[str, str] = {}
    guide = guide_packages()
    assert set(EXAMPLES) <= set(guide), "the guide lost an example"
    for dist, files in guide.items():
        sources.append(write(root / dist, files))
        for hook in EXAMPLES[dist][2]:
            name, variant = raising_variant(dist, files, hook)
            sources.append(write(root / name, variant))
            bad[name] = hook
    for hook, arg in OTHER_HOOKS.items():
        name, files = lone_hook_plugin(hook, arg)
        sources.append(write(root / name, files))
        bad[name] = hook
    sources.append(write(root / "bad_import", _package("bad_import", "raise ImportError('no')\n")))
    bad["bad_import"] = "load"
    scaffolded = [write_plugin(name, kind, root) for name, kind in SCAFFOLDED.items()]
    scaffolded.append(write_plugin("np_transport", "transport", root))
    sources += scaffolded
    target = root / "site"
    command = ["uv", "pip", "install", "--quiet", "--no-deps", "--target", str(target)]
    subprocess.run([*command, *map(str, sources)], check=True, timeout=600)
    return Site(target, bad, scaffolded)


@pytest.fixture(scope="module")
def node(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoProcess]:
    with exo_processes(tmp_path_factory.mktemp("node"), 1, env=site.env()) as (node,):
        wait_until(lambda: _get(node, "/healthz").get("master") is not None)
        yield node


def _get(node: ExoProcess, path: str) -> dict[str, object]:
    try:
        return node.get(path)
    except httpx.HTTPError:
        return {}


@pytest.mark.slow
def test_the_authored_plugins_work(node: ExoProcess) -> None:
    assert httpx.get(f"{node.url}/hello").json()["hello"] == "world"
    assert httpx.get(f"{node.url}/np_route").json()["plugin"] == "np_route"
    client = OpenAI(base_url=f"{node.url}/v1", api_key="unused", timeout=60)
    for model in ("echo", "np_engine"):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello there"}]
        )
        assert reply.choices[0].message.content == "hello there"
    for path in ("/audit", "/np_observer"):
        counts = httpx.get(f"{node.url}{path}").json()
        assert counts["NodeTelemetry"] >= 1 and counts["InstanceCreated"] >= 1


@pytest.mark.slow
def test_each_raising_plugin_is_named_in_one_log_line_and_exo_keeps_serving(
    node: ExoProcess, site: Site
) -> None:
    httpx.post(f"{node.url}/instance", json={"model_id": "echo"}, timeout=30)  # placement hooks
    assert httpx.get(f"{node.url}/hello").status_code == 200
    plugins = httpx.get(f"{node.url}/plugins").json()
    failed = {f["name"]: f["hook"] for f in plugins["failed"]}
    log = node.log().splitlines()
    for name, hook in site.bad.items():
        lines = [line for line in log if f"plugin {name}:" in line or f"plugin {name} " in line]
        assert lines, f"no log line names {name}"
        assert all("ERROR" in line for line in lines), lines
        if hook == "load":
            assert "failed to load" in lines[0] and "ImportError: no" in lines[0]
            assert failed[name] == "load"
        else:
            assert f"{hook} raised RuntimeError: {name} raised on purpose" in lines[0]
            if hook in RUNTIME_HOOKS:
                assert name not in failed  # logged, and still registered
            else:
                assert failed[name] == hook and lines[0].endswith("plugin left out")


@pytest.mark.slow
def test_exo_plugins_shows_failed_and_disabled_plugins(site: Site) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exo_core.cli", "--disable-plugin", "audit", "plugins"],
        env={**_environ(), **site.env()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^hello\s+exo-hello 0\.1\.0\s+hooks: exo_routes$", out.stdout, re.M)
    assert re.search(r"^audit\s+DISABLED", out.stdout, re.M)
    assert re.search(r"^bad_import\s+FAILED TO LOAD: ImportError: no$", out.stdout, re.M)
    assert re.search(r"^bad_add_cli_options\s+FAILED in exo_add_cli_options: ", out.stdout, re.M)


@pytest.mark.slow
def test_the_tests_exo_new_plugin_writes_pass_against_the_installed_packages(site: Site) -> None:
    tests = [str(root / "tests") for root in site.scaffolded]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        env={**_environ(), **site.env()},
        cwd=site.path.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert re.search(r"\b5 passed\b", out.stdout), out.stdout[-500:]


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.mark.slow
def test_echo_instances_go_only_to_the_node_with_the_echo_engine(
    site: Site, tmp_path: Path
) -> None:
    """Node 1 has the echo plugin disabled: no engine for the card, nor the card. When it is the
    master, the card travels with the placement request (unit-tested in test_placement)."""
    extra = [[], ["--disable-plugin", "echo"]]
    with exo_processes(tmp_path, 2, extra_args=extra, env=site.env()) as (with_echo, _without):

        def both_report() -> bool:
            nodes = _get(with_echo, "/state").get("nodes") or {}
            return (
                isinstance(nodes, dict)
                and len(nodes) == 2
                and all(n["resources"]["serves"] is not None for n in nodes.values())
            )

        wait_until(both_report, timeout=90)
        echo_id = _get(with_echo, "/node_id")["node_id"]
        serves = {
            i: n["resources"]["serves"] for i, n in _get(with_echo, "/state")["nodes"].items()
        }
        assert "echo" in serves.pop(echo_id) and all("echo" not in s for s in serves.values())
        placed = httpx.post(f"{with_echo.url}/instance", json={"model_id": "echo"}, timeout=30)
        assert placed.status_code == 201, placed.text
        instance = _get(with_echo, f"/instance/{placed.json()['instance_id']}")
        assert [s["node_id"] for s in instance["shards"]] == [echo_id], json.dumps(instance)
        two = httpx.post(
            f"{with_echo.url}/instance", json={"model_id": "echo", "min_nodes": 2}, timeout=30
        )
        assert two.status_code == 409, two.text
        assert "can serve" in two.text or "min_nodes=2" in two.text
