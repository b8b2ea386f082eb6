"""The core's own hook implementations, registered before any plugin."""

from types import ModuleType

from exo_core.builtin import default_placement, output_parsers

CORE_PLUGINS: list[tuple[str, ModuleType]] = [
    ("core.placement", default_placement),
    ("core.parsers", output_parsers),
]
