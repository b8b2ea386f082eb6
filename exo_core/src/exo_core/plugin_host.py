"""Loading plugins: the core's own hook implementations, then every `exo.plugins` entry point.

A plugin that fails to import or register is reported by name and skipped: one broken plugin
never stops a node from starting.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass

import pluggy
from loguru import logger

from exo_core import hookspecs
from exo_core.builtin import CORE_PLUGINS

ENTRY_POINT_GROUP = "exo.plugins"


@dataclass(frozen=True)
class PluginFailure:
    name: str
    error: str


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


class PluginHost:
    def __init__(self, pm: pluggy.PluginManager, failures: list[PluginFailure]) -> None:
        self.pm = pm
        self.hook = pm.hook
        self.failures = failures

    def plugins(self) -> list[PluginInfo]:
        """The plugins loaded from entry points, with their distributions and hooks."""
        infos = []
        for plugin, dist in self.pm.list_plugin_distinfo():
            name = self.pm.get_name(plugin) or "?"
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or []))
            infos.append(
                PluginInfo(
                    name=name,
                    distribution=dist.metadata["name"],
                    version=dist.version,
                    hooks=hooks,
                )
            )
        return sorted(infos, key=lambda p: p.name)


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, module in CORE_PLUGINS:
        pm.register(module, name=name)
    return pm


def load_plugins(disabled: Iterable[str] = (), entry_points: bool = True) -> PluginHost:
    pm = new_plugin_manager()
    failures: list[PluginFailure] = []
    for name in disabled:
        pm.set_blocked(name)
    if entry_points:
        names = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        for name in names:
            if pm.is_blocked(name):
                logger.info(f"plugin {name} is disabled")
                continue
            try:
                # One name at a time, so that one failing plugin does not hide the others.
                pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
            except Exception as e:
                logger.error(f"plugin {name} failed to load and is skipped: {e!r}")
                failures.append(PluginFailure(name=name, error=repr(e)))
                if (plugin := pm.get_plugin(name)) is not None:
                    pm.unregister(plugin)
    return PluginHost(pm, failures)
