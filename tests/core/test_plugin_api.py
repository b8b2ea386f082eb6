"""The shape of the plugin API: a short top level (hooks, context, data model, errors), one
sub-module per job, each name in one place, every name documented and used, and every hook
grouped by the phase it is called in with the API version that added it."""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pluggy

import exo_core.plugin as api
from exo_core import hookspecs

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_LIMIT = 60


def _modules() -> list[ModuleType]:
    subs = [m.name for m in pkgutil.iter_modules(api.__path__) if not m.name.startswith("_")]
    return [api, *(importlib.import_module(f"exo_core.plugin.{s}") for s in subs)]


def _imported_from(module: ModuleType, name: str) -> tuple[str, str]:
    """(module, name) a public module re-exports `name` from."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return node.module, alias.name
    return module.__name__, name


def _attribute_docstring(module_name: str, name: str) -> str | None:
    """The string right after `name = ...` at the top of a module (how constants and type
    aliases are documented)."""
    body = ast.parse(Path(importlib.import_module(module_name).__file__ or "").read_text()).body
    for statement, after in itertools.pairwise(body):
        target = (
            statement.targets[0]
            if isinstance(statement, ast.Assign)
            else statement.target
            if isinstance(statement, ast.AnnAssign)
            else None
        )
        if isinstance(target, ast.Name) and target.id == name:
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                return str(after.value.value)
            return None
    return None


def _docstring(module: ModuleType, name: str) -> str | None:
    obj = getattr(module, name)
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__")  # its own, not a base class's
    if inspect.isfunction(obj) or inspect.isfunction(getattr(obj, "__wrapped__", None)):
        return obj.__doc__
    return _attribute_docstring(*_imported_from(module, name))


def test_the_top_level_is_short() -> None:
    assert len(api.__all__) <= TOP_LEVEL_LIMIT


def test_each_name_lives_in_one_module() -> None:
    seen: dict[str, str] = {}
    for module in _modules():
        for name in module.__all__:
            assert name not in seen, f"{name} in both {seen[name]} and {module.__name__}"
            seen[name] = module.__name__
    assert len(_modules()) >= 5


def test_every_public_name_is_documented() -> None:
    missing = [
        f"{module.__name__}.{name}"
        for module in _modules()
        for name in module.__all__
        if not (_docstring(module, name) or "").strip()
    ]
    assert missing == []


def test_the_docstring_check_sees_a_missing_one() -> None:
    assert _attribute_docstring("exo_core.ids", "CommandId") is None  # not public: no docstring
    assert _attribute_docstring("exo_core.ids", "ModelId")
    assert _docstring(api, "RunnerStatus") == api.RunnerStatus.__doc__


def _used_names() -> str:
    """The text of every plugin, its tests, the docs and the plugin template."""
    files = [*ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")]
    files += [*ROOT.glob("docs/*.md"), ROOT / "README.md"]
    files.append(ROOT / "exo_core/src/exo_core/scaffold.py")
    return "\n".join(f.read_text() for f in files)


def test_every_public_name_is_used_by_a_plugin_or_the_docs() -> None:
    text = _used_names()
    unused = [
        f"{module.__name__}.{name}"
        for module in _modules()
        for name in module.__all__
        if name != "API_VERSION" and not re.search(rf"\b{name}\b", text)
    ]
    assert unused == []


def _hookspecs() -> list[str]:
    marker = f"{hookspecs.PROJECT}_spec"
    return [n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, marker)]


def test_every_hook_has_a_phase_and_the_version_that_added_it() -> None:
    hooks = _hookspecs()
    assert len(hooks) >= 10
    phased = [h for names in hookspecs.PHASES.values() for h in names]
    assert sorted(phased) == sorted(hooks)
    assert set(hookspecs.PHASES) == {"start-up", "serving", "observing", "cli"}
    assert sorted(hookspecs.ADDED_IN) == sorted(hooks)
    current = tuple(int(p) for p in api.API_VERSION.split("."))
    for hook, version in hookspecs.ADDED_IN.items():
        assert tuple(int(p) for p in version.split(".")) <= current
        assert f"Since API {version}." in (getattr(hookspecs, hook).__doc__ or ""), hook


def test_the_hookspecs_are_what_pluggy_registers() -> None:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    assert sorted(n for n in dir(manager.hook) if n.startswith("exo_")) == sorted(_hookspecs())


def test_the_guide_lists_each_sub_module_with_its_names() -> None:
    """docs/plugins.md's table of sub-modules says which names live where: it stays true."""
    guide = (ROOT / "docs" / "plugins.md").read_text()
    rows = dict(re.findall(r"^\| `(exo_core\.plugin\.\w+)` \| [^|]* \| (.*) \|$", guide, re.M))
    subs = {m.__name__: m for m in _modules() if m is not api}
    assert sorted(rows) == sorted(subs)
    for name, module in subs.items():
        assert sorted(re.findall(r"`(\w+)`", rows[name])) == sorted(module.__all__), name
