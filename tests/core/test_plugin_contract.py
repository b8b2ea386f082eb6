"""The plugin contract, in process: the public API is all built-in plugins use, and a plugin
that raises in any hook is named once and left out while the node keeps starting and serving."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import tomllib
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anthropic
import anyio
import httpx
import ollama
import openai
import pytest
from litestar import get
from litestar.exceptions import LitestarWarning
from loguru import logger

import exo_core.plugin as api
from exo_core import worker
from exo_core.api.app import create_app
from exo_core.cli import build_parser, core_dests
from exo_core.config import NodeConfig
from exo_core.node import Node
from exo_core.plugin import NodeContext, RunnerStatus, download, hookimpl, placement
from exo_core.plugin.engine import Runner, RunnerSpec, StatusReporter
from exo_core.plugin_host import PluginHost, load_plugins
from exo_core.testing import ScriptedEngine, ScriptedEnginePlugin, running_node, wait_until_async

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "exo_core.plugin"


def _test_support(path: Path) -> bool:
    return "tests" in path.parts or path.stem in ("testing", "conftest") or path.stem == "support"


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in a module, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    allowed = [PUBLIC, "exo_core.testing"] if _test_support(path) else [PUBLIC]
    bad = []
    for line, name in _imports(tree):
        if name.split(".")[0] != "exo_core":
            continue
        if not any(name == a or name.startswith(a + ".") for a in allowed):
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad + _unlisted_names(path, tree)


def _public_modules() -> dict[str, ModuleType]:
    """`exo_core.plugin` and its sub-modules (`exo_core.plugin.engine`, ...), by name."""
    subs = [m.name for m in pkgutil.iter_modules(api.__path__) if not m.name.startswith("_")]
    found = {PUBLIC: api}
    found.update({f"{PUBLIC}.{s}": importlib.import_module(f"{PUBLIC}.{s}") for s in subs})
    return found


def _unlisted_names(path: Path, tree: ast.AST) -> list[str]:
    """Imports from the plugin API of a module or a name it does not list in `__all__`: what
    a module merely imports for itself is no part of the API."""
    public = _public_modules()
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules, names = [node.module], [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [a.name for a in node.names], []
        else:
            continue
        for module in modules:
            if module != PUBLIC and not module.startswith(PUBLIC + "."):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if module not in public:
                bad.append(f"{where} imports {module}, no module of the plugin API")
                continue
            listed = public[module].__all__
            unlisted = [n for n in names if n not in listed and f"{module}.{n}" not in public]
            bad += [f"{where} imports {n} from {module}" for n in unlisted]
    return bad


def test_plugins_import_only_the_public_plugin_api() -> None:
    """Every plugin under plugins/ (those added later included) uses `exo_core.plugin`; its tests
    and test helpers may also use `exo_core.testing`."""
    files = [p for p in (ROOT / "plugins").rglob("*.py") if ".venv" not in p.parts]
    assert len(files) > 20
    bad = [line for path in files for line in _private_imports(path)]
    assert bad == []


def test_the_check_catches_a_private_import(tmp_path: Path) -> None:
    module = ROOT / "plugins" / "_probe_private_import.py"
    module.write_text("from exo_core.node import Node\nfrom exo_core.plugin import hookimpl\n")
    try:
        assert _private_imports(module) == [
            "plugins/_probe_private_import.py:1 imports exo_core.node"
        ]
    finally:
        module.unlink()


def test_the_check_catches_a_name_the_plugin_api_does_not_list() -> None:
    module = ROOT / "plugins" / "_probe_unlisted_name.py"
    module.write_text(
        "from exo_core.plugin import hookimpl, replace_durably\n"
        "from exo_core.plugin.engine import build_prefix_shim, runner_env\n"
        "import exo_core.plugin.blas\n"
    )
    try:
        assert _private_imports(module) == [
            "plugins/_probe_unlisted_name.py:1 imports replace_durably from exo_core.plugin",
            "plugins/_probe_unlisted_name.py:2 imports build_prefix_shim from exo_core.plugin.engine",
            "plugins/_probe_unlisted_name.py:3 imports exo_core.plugin.blas, no module of the plugin API",
        ]
    finally:
        module.unlink()


def _undeclared_exo_imports(package_dir: Path, root: Path = ROOT) -> list[str]:
    """`exo_*` packages a plugin's own code imports without depending on them: a plugin that
    reached into another plugin would break when that one is not installed."""
    project = tomllib.loads((package_dir.parents[1] / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[\s\[<>=;]", dep, maxsplit=1)[0].replace("-", "_")
        for dep in project.get("dependencies", [])
    }
    allowed = declared | {package_dir.name, "exo_core"}
    bad = []
    for path in package_dir.rglob("*.py"):
        for line, name in _imports(ast.parse(path.read_text(), str(path))):
            top = name.split(".")[0]
            if top.startswith("exo_") and top not in allowed:
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


def test_plugins_import_no_other_plugin_they_do_not_depend_on() -> None:
    packages = [p for p in (ROOT / "plugins").glob("*/src/exo_*") if p.is_dir()]
    assert len(packages) >= 8
    assert [line for p in packages for line in _undeclared_exo_imports(p)] == []


def test_the_dependency_check_catches_a_plugin_importing_another(tmp_path: Path) -> None:
    package = tmp_path / "plugins" / "probe" / "src" / "exo_probe"
    package.mkdir(parents=True)
    (package.parents[1] / "pyproject.toml").write_text(
        '[project]\nname = "exo-probe"\ndependencies = ["exo-core", "exo-api-openai>=0.1"]\n'
    )
    (package / "m.py").write_text(
        "import exo_api_openai.routes\nfrom exo_engine_mlx.harmony import is_harmony\n"
    )
    assert _undeclared_exo_imports(package, root=tmp_path) == [
        "plugins/probe/src/exo_probe/m.py:2 imports exo_engine_mlx.harmony"
    ]


def test_the_public_module_exports_what_it_lists() -> None:
    assert all(hasattr(api, name) for name in api.__all__)
    major, minor = api.API_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()
    for needed in ("hookimpl", "NodeContext", "ModelCard", "State", "GenerationParams"):
        assert needed in api.__all__
    for module in _public_modules().values():
        assert all(hasattr(module, name) for name in module.__all__), module.__name__


def test_routes_of_every_installed_plugin_build_without_litestar_deprecations(
    tmp_path: Path,
) -> None:
    node = Node(NodeConfig(data_dir=str(tmp_path), transport="memory"), load_plugins())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_app(node)
    litestar = [w for w in caught if issubclass(w.category, (LitestarWarning, DeprecationWarning))]
    assert [str(w.message) for w in litestar] == []
    assert isinstance(node, NodeContext)


# -- a raising plugin is named once and left out ------------------------------------------------


@get("/good")
async def good_route(node: api.InjectedNode) -> dict[str, str]:
    return {"node": node.node_id}


@get("/good")
async def same_route_again() -> dict[str, str]:
    return {}


@get("/unannotated")
async def unannotated(node) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {}


def _raising(hook: str) -> Any:
    def fail(*_: Any) -> Any:
        raise RuntimeError(f"{hook} broke on purpose")

    return hookimpl(specname=hook)(fail)


class _Plugin:
    __name__ = "?"


def _plugin(name: str, **hooks: Any) -> object:
    methods = {hook: staticmethod(fn) for hook, fn in hooks.items()}
    return type(name, (_Plugin,), {"__name__": name, **methods})()


BAD_AT_START = {
    "bad_engines": "exo_engines",
    "bad_cards": "exo_model_cards",
    "bad_parsers": "exo_output_parsers",
    "bad_priority": "exo_election_priority",
    "bad_downloader": "exo_downloader",
    "bad_transport": "exo_transport",
    "bad_routes": "exo_routes",
}


@pytest.fixture
def log() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(
        lambda m: lines.append(str(m).rstrip("\n")), level="WARNING", format="{message}"
    )
    yield lines
    logger.remove(sink)


def _named(lines: list[str], name: str) -> list[str]:
    return [line for line in lines if line.startswith(f"plugin {name}:")]


def test_a_plugin_raising_in_any_startup_hook_is_named_once_and_left_out(
    tmp_path: Path, log: list[str]
) -> None:
    host = load_plugins(entry_points=False)
    for name, hook in BAD_AT_START.items():
        host.register(_plugin(name, **{hook: _raising(hook)}), name=name)
    # Called in reverse order of registration: "good" claims /good before "dup" does.
    host.register(_plugin("dup", exo_routes=hookimpl(lambda: [same_route_again])), name="dup")
    host.register(_plugin("good", exo_routes=hookimpl(lambda: [good_route])), name="good")
    host.register(_plugin("untyped", exo_routes=hookimpl(lambda: [unannotated])), name="untyped")
    host.register(ScriptedEnginePlugin(), name="scripted")
    node = Node(NodeConfig(data_dir=str(tmp_path), transport=""), host)
    app = create_app(node)
    paths = {route.path for route in app.routes}
    assert "/good" in paths and "/unannotated" not in paths
    assert [e.name for e in node.engines] == ["scripted"]
    left_out = {f.name: f.hook for f in host.failures}
    assert left_out == {**BAD_AT_START, "dup": "exo_routes", "untyped": "exo_routes"}
    for name, hook in BAD_AT_START.items():
        (line,) = _named(log, name)
        assert f"{hook} raised RuntimeError: {hook} broke on purpose" in line
        assert host.pm.get_plugin(name) is None
    (line,) = _named(log, "untyped")
    assert "'node' does not have a type annotation" in line


class _Observers:
    def __init__(self) -> None:
        self.seen = 0

    @hookimpl(tryfirst=True)
    def exo_event_applied(self, ctx: NodeContext) -> None:
        raise RuntimeError("observer broke on purpose")


class _Counter:
    def __init__(self) -> None:
        self.seen = 0
        self.jobs = 0

    @hookimpl(trylast=True)
    def exo_event_applied(self, ctx: NodeContext) -> None:
        self.seen += 1
        if self.seen == 1:
            ctx.spawn(self.failing_job)

    async def failing_job(self) -> None:
        self.jobs += 1
        raise RuntimeError("job broke on purpose")


def test_a_raising_observer_or_job_never_stops_the_others_or_the_node(
    tmp_path: Path, log: list[str]
) -> None:
    counter = _Counter()
    with running_node(tmp_path, plugins=[_Observers(), counter]) as running:
        running.call(wait_until_async, lambda: counter.jobs == 1 and counter.seen >= 2)
        assert httpx.get(f"{running.url}/healthz").json()["status"] == "ok"
    raised = [line for line in log if "observer broke on purpose" in line]
    assert raised and all(
        line.startswith("plugin _Observers: exo_event_applied") for line in raised
    )
    (job,) = [line for line in log if "job broke on purpose" in line]
    assert job.startswith("plugin _Counter: background job _Counter.failing_job raised")


# -- command line -------------------------------------------------------------------------------


def _host(*plugins: tuple[str, object]) -> PluginHost:
    host = load_plugins(entry_points=False)
    for name, plugin in plugins:
        host.register(plugin, name=name)
    return host


def test_cli_option_conflicts_and_misspelled_hooks_are_reported(log: list[str]) -> None:
    def takes_api_port(parser: Any) -> None:
        parser.add_argument("--fine-before-the-conflict")
        parser.add_argument("--api-port")

    def adds_one(parser: Any) -> None:
        parser.add_argument("--my-option", default="x")

    host = _host(
        ("clash", _plugin("clash", exo_add_cli_options=hookimpl(takes_api_port))),
        ("mine", _plugin("mine", exo_add_cli_options=hookimpl(adds_one))),
        ("typo", _plugin("typo", exo_rutes=hookimpl(lambda: []))),
        ("unmarked", _plugin("unmarked", exo_routes=lambda: [])),
    )
    args = build_parser(host).parse_args(["--my-option", "y"])
    assert args.my_option == "y" and not hasattr(args, "fine_before_the_conflict")
    assert [(f.name, f.hook) for f in host.failures] == [("clash", "exo_add_cli_options")]
    assert "--api-port" in _named(log, "clash")[0]
    assert "unknown hook exo_rutes (did you mean exo_routes?)" in _named(log, "typo")[0]
    assert "exo_routes is not marked @hookimpl" in _named(log, "unmarked")[0]
    assert "my_option" not in core_dests() and "api_port" in core_dests()


def test_an_unknown_disable_plugin_name_is_reported() -> None:
    host = load_plugins(disabled=["api_openai", "no_such_plugin"])
    assert host.disabled == ["api_openai"]
    assert any(
        "--disable-plugin no_such_plugin: no plugin has that name" in w for w in host.warnings
    )


# -- a runner's failure reaches the client -------------------------------------------------------


def test_a_runner_that_fails_to_load_answers_a_5xx_with_its_reason_in_each_dialect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker, "BACKOFF_BASE_S", 0.05)
    with running_node(tmp_path, [ScriptedEnginePlugin(fail_load=True)]) as node:
        openai_client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.InternalServerError) as got:
            openai_client.chat.completions.create(
                model="scripted-echo", messages=[{"role": "user", "content": "hi"}]
            )
        assert "scripted load failure" in got.value.message
        claude = anthropic.Anthropic(base_url=node.url, api_key="-", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as failed:
            claude.messages.create(
                model="scripted-echo", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert "scripted load failure" in failed.value.message
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=node.url).chat(
                model="scripted-echo", messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.status_code >= 500
        assert "scripted load failure" in refused.value.error


class _RecordingDownloader(download.Downloader):
    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_local(self, card: api.ModelCard) -> Path | None:
        self.asked.append(f"find_local {card.model_id}")
        return None

    async def ensure(self, card: api.ModelCard, report: download.ProgressReporter) -> Path:
        self.asked.append(f"ensure {card.model_id}")
        raise download.DownloadFailed("the downloader was asked")

    async def delete(self, card: api.ModelCard) -> bool:
        self.asked.append(f"delete {card.model_id}")
        return False


class _DownloaderPlugin:
    def __init__(self) -> None:
        self.downloader = _RecordingDownloader()

    @hookimpl
    def exo_downloader(self) -> download.Downloader:
        return self.downloader


def test_an_engine_that_needs_no_download_never_asks_the_downloader(tmp_path: Path) -> None:
    # The scripted engine says `needs_download = False` and its `prepare_model` returns None.
    plugin = _DownloaderPlugin()
    with running_node(tmp_path, [ScriptedEnginePlugin(), plugin]) as node:
        client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0)
        answer = client.chat.completions.create(
            model="scripted-echo", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "echo: hi"
    assert plugin.downloader.asked == []


class _NeverReady(ScriptedEngine):
    name = "never"

    def create_runner(self, spec: RunnerSpec) -> Runner:
        runner = super().create_runner(spec)

        async def serve(report: StatusReporter) -> None:
            report(RunnerStatus.LOADING, None)
            await anyio.sleep_forever()

        runner.serve = serve  # type: ignore[method-assign]
        return runner


def test_a_runner_that_never_becomes_ready_fails_the_request_after_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: list[str]
) -> None:
    monkeypatch.setattr(worker, "READY_TIMEOUT_S", 2.0)
    plugin = ScriptedEnginePlugin()
    plugin.engine = _NeverReady()
    with running_node(tmp_path, [plugin]) as node:
        client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.InternalServerError) as got:
            client.chat.completions.create(
                model="scripted-echo", messages=[{"role": "user", "content": "hi"}]
            )
    assert "did not become ready within 2 s (it is loading)" in got.value.message
    assert any("did not become ready" in line for line in log)


class _LayerPicky(ScriptedEngine):
    """Refuses any pipeline whose first rank starts at layer 0 (every pipeline): a stand-in
    for an engine that refuses splits by the layers each rank gets."""

    name = "picky"

    def placement_refusal(
        self, card: api.ModelCard, option: placement.PlacementOption
    ) -> str | None:
        first = option.shares[0]
        if option.sharding == "pipeline" and first.start_layer == 0:
            return f"picky: rank 0 would hold layers [0, {first.end_layer})"
        return super().placement_refusal(card, option)


def test_placement_asks_the_engine_about_each_ranks_layers(tmp_path: Path) -> None:
    plugin = ScriptedEnginePlugin()
    plugin.engine = _LayerPicky()
    with running_node(tmp_path, [plugin]) as node:
        url = f"{node.url}/instance/previews"
        body = httpx.get(url, params={"model_id": "scripted-echo"}).json()
        assert [p["sharding"] for p in body["previews"]] == ["tensor"]
        params = {"model_id": "scripted-echo", "sharding": "pipeline"}
        refused = httpx.get(url, params=params).json()
    assert (
        refused["previews"] == [] and refused["refused"] == "picky: rank 0 would hold layers [0, 4)"
    )
