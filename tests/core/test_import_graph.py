"""The core's modules import one another without a circle (TYPE_CHECKING imports count: a
type-only circle still means two modules know each other's insides), and none is over 500
lines (small modules, one job each)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "exo_core" / "src" / "exo_core"
MAX_LINES = 500


def _module(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, path: Path, modules: set[str]) -> set[str]:
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod where there is one.
            found.update(
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            )
    # A package importing its own submodules (or they it) is the package's business, not a
    # circle between modules that know each other.
    return {m for m in found & modules if m != name and not m.startswith(name + ".")}


def core_imports() -> dict[str, set[str]]:
    """Which core module imports which (every `import`/`from` naming an exo_core module)."""
    paths = {_module(p): p for p in CORE.rglob("*.py")}
    return {name: _imported(name, path, set(paths)) for name, path in paths.items()}


def test_the_core_has_no_import_circle() -> None:
    try:
        tuple(graphlib.TopologicalSorter(core_imports()).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"an import circle in exo_core: {' -> '.join(e.args[1])}") from None


def test_the_graph_holds_the_imports() -> None:
    """The check above can fail: the graph it reads holds the core's real imports."""
    graph = core_imports()
    assert "exo_core.service" in graph["exo_core.node"]
    assert "exo_core.node" in graph["exo_core.api.app"]


def test_no_core_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(CORE)): n
        for p in CORE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"core modules over {MAX_LINES} lines: {long}"


def test_the_plugins_context_is_the_protocol_and_nothing_more() -> None:
    from exo_core.context import NodeContext, PluginContext

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert public(PluginContext) == public(NodeContext)
