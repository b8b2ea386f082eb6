"""Loading plugins and calling their hooks, one plugin at a time.

The core's own hook implementations are registered first, then every `exo.plugins` entry point.
A plugin that fails to import or register, or whose hook raises while the node starts, is
reported once by name with the real cause and left out: one broken plugin never stops a node.
Hooks called while the node runs (observers, placement) are isolated the same way, but a
plugin that raises there stays registered: the failure is logged and the next plugin runs.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy
from loguru import logger

from exo_core import hookspecs
from exo_core.builtin import CORE_PLUGINS

ENTRY_POINT_GROUP = "exo.plugins"

Call = Callable[..., Any]
"""One plugin's implementation of one hook, called with the hook's keyword arguments."""


@dataclass(frozen=True)
class PluginFailure:
    name: str
    error: str
    #: "load" for an import or registration failure, else the hook that raised.
    hook: str = "load"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


def describe(exc: BaseException) -> str:
    """The cause in one line, with every sub-exception of an exception group."""
    if isinstance(exc, BaseExceptionGroup):
        inner = "; ".join(describe(e) for e in exc.exceptions)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType, reportUnknownVariableType]
        return f"{type(exc).__name__}: {exc.message} [{inner}]"
    return f"{type(exc).__name__}: {exc}"


def hook_names() -> list[str]:
    return sorted(n for n in dir(hookspecs) if n.startswith("exo_"))


@dataclass
class PluginHost:
    pm: pluggy.PluginManager
    failures: list[PluginFailure] = field(default_factory=list)
    #: Plugins left out with `--disable-plugin`.
    disabled: list[str] = field(default_factory=list)
    #: Problems that do not leave a plugin out: misspelled hooks, unknown `--disable-plugin` names.
    warnings: list[str] = field(default_factory=list)

    @property
    def hook(self) -> pluggy.HookRelay:
        """pluggy's own relay: calls every plugin at once, with no isolation. Prefer the
        methods below."""
        return self.pm.hook

    # -- who is who -----------------------------------------------------------------------------

    def name_of(self, plugin: object) -> str:
        name = self.pm.get_name(plugin) or ""
        if not name or name.isdigit():  # registered without a name (tests): pluggy used id()
            name = getattr(plugin, "__name__", None) or type(plugin).__name__
        return name

    def owner_of(self, fn: object) -> str | None:
        """The plugin whose package defines `fn` (for naming a failed background job)."""
        while isinstance(fn, functools.partial):
            fn = fn.func
        owner = getattr(fn, "__self__", None)  # a bound method of a plugin object
        if owner is not None and self.pm.is_registered(owner):
            return self.name_of(owner)
        module = getattr(fn, "__module__", None) or ""
        top = module.split(".")[0]
        for _, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            mod = getattr(plugin, "__name__", None) or type(plugin).__module__
            if mod == module or mod.split(".")[0] == top:
                return self.name_of(plugin)
        return None

    def plugins(self) -> list[PluginInfo]:
        """The plugins loaded from entry points, with their distributions and hooks."""
        infos = []
        for plugin, dist in self.pm.list_plugin_distinfo():
            if not self.pm.is_registered(plugin):
                continue  # left out after a failure: pluggy keeps its distinfo, `failures` has it
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or []))
            infos.append(
                PluginInfo(
                    name=self.name_of(plugin),
                    distribution=dist.metadata["name"],
                    version=dist.version,
                    hooks=hooks,
                )
            )
        return sorted(infos, key=lambda p: p.name)

    # -- calling hooks, one plugin at a time ----------------------------------------------------

    def implementations(self, hook: str) -> list[tuple[str, Call]]:
        """(plugin name, implementation) in pluggy's call order (`tryfirst` first, then the
        latest registered first, `trylast` last)."""
        caller: pluggy.HookCaller = getattr(self.pm.hook, hook)
        out: list[tuple[str, Call]] = []
        for impl in reversed(caller.get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                continue  # wrappers are not part of exo's plugin API
            out.append((self.name_of(impl.plugin), _bind(impl.function, impl.argnames)))
        return out

    def attempt(
        self, name: str, hook: str, fn: Call, /, *, leave_out: bool, **kwargs: Any
    ) -> tuple[bool, Any]:
        """(True, fn(**kwargs)) for plugin `name`, or (False, None) with the failure reported
        (and the plugin left out when `leave_out`)."""
        try:
            return True, fn(**kwargs)
        except Exception as e:
            self.fail(name, hook, e, leave_out=leave_out)
            return False, None

    def collect(self, hook: str, *, leave_out: bool = True, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call a startup hook on every plugin: (plugin name, result) for each result that is
        not None. A plugin that raises is reported and (when `leave_out`) left out."""
        results: list[tuple[str, Any]] = []
        for name, call in self.implementations(hook):
            ok, result = self.attempt(name, hook, call, leave_out=leave_out, **kwargs)
            if ok and result is not None:
                results.append((name, result))
        return results

    def results(self, hook: str, **kwargs: Any) -> list[Any]:
        return self.kept(self.collect(hook, **kwargs))

    def kept(self, collected: list[tuple[str, Any]]) -> list[Any]:
        """The results of plugins not left out (since, by a later hook)."""
        gone = {f.name for f in self.failures}
        return [result for name, result in collected if name not in gone]

    def first(
        self,
        hook: str,
        *,
        leave_out: bool = True,
        passthrough: tuple[type[Exception], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """The first result that is not None. A plugin that raises is reported (and left out
        when `leave_out`) and the next one asked; `passthrough` exceptions are answers, not
        failures, and propagate."""
        for name, call in self.implementations(hook):
            try:
                result = call(**kwargs)
            except passthrough:
                raise
            except Exception as e:
                self.fail(name, hook, e, leave_out=leave_out)
                continue
            if result is not None:
                return result
        return None

    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook on every plugin while the node runs. Never raises: a plugin
        that raises is logged by name and the others are still called."""
        for name, call in self.implementations(hook):
            self.attempt(name, hook, call, leave_out=False, **kwargs)

    def fail(self, name: str, hook: str, exc: BaseException, *, leave_out: bool) -> None:
        """Report a plugin's failure in one log line naming it, and leave it out if asked."""
        cause = describe(exc)
        logger.error(
            f"plugin {name}: {hook} raised {cause}" + ("; plugin left out" if leave_out else "")
        )
        logger.opt(exception=exc).debug(f"plugin {name}: where {hook} raised")
        if not leave_out:
            return
        self.failures.append(PluginFailure(name=name, error=cause, hook=hook))
        plugin = self.pm.get_plugin(name)
        if plugin is None:  # registered without a name
            plugin = next(
                (p for n, p in self.pm.list_name_plugin() if self.name_of(p) == name), None
            )
        if plugin is not None:
            self.pm.unregister(plugin)

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register an in-process plugin (tests, embedding): reported and skipped when pluggy
        refuses it, like an entry point."""
        try:
            self.pm.register(plugin, name=name)
        except Exception as e:
            shown = name or getattr(plugin, "__name__", None) or type(plugin).__name__
            logger.error(f"plugin {shown} failed to register and is skipped: {describe(e)}")
            self.failures.append(PluginFailure(name=shown, error=describe(e)))
            return
        self.check_hook_names(plugin)

    # -- checks ---------------------------------------------------------------------------------

    def check_hook_names(self, plugin: object) -> None:
        """Report `plugin`'s implementations of hooks that do not exist (a misspelled name),
        and its `exo_` functions that lack the `@hookimpl` marker: both are never called."""
        name = self.name_of(plugin)
        for caller in self.pm.get_hookcallers(plugin) or []:
            if not caller.has_spec():
                self.warn(f"plugin {name}: {_unknown(caller.name, hook_names())}")
        owner = getattr(plugin, "__name__", None) if inspect.ismodule(plugin) else None
        for attr in dir(plugin):
            value = getattr(plugin, attr, None)
            if not attr.startswith("exo_") or not callable(value):
                continue
            if owner is not None and getattr(value, "__module__", None) != owner:
                continue  # imported into the module, not defined there
            if self.pm.parse_hookimpl_opts(plugin, attr) is None:
                self.warn(f"plugin {name}: {attr} is not marked @hookimpl and is never called")

    def warn(self, message: str) -> None:
        logger.warning(message)
        self.warnings.append(message)


def _unknown(hook: str, known: list[str]) -> str:
    close = difflib.get_close_matches(hook, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"implements unknown hook {hook}{hint}; it is never called"


def _bind(function: Callable[..., Any], argnames: tuple[str, ...]) -> Call:
    """pluggy passes an implementation only the arguments it declares, by position."""

    def call(**kwargs: Any) -> Any:
        return function(*(kwargs[a] for a in argnames))

    return call


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, module in CORE_PLUGINS:
        pm.register(module, name=name)
    return pm


def load_plugins(disabled: Iterable[str] = (), entry_points: bool = True) -> PluginHost:
    pm = new_plugin_manager()
    host = PluginHost(pm)
    disabled = list(dict.fromkeys(disabled))
    for name in disabled:
        pm.set_blocked(name)
    names = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
    if entry_points:
        for name in names:
            if pm.is_blocked(name):
                logger.info(f"plugin {name} is disabled")
                host.disabled.append(name)
                continue
            try:
                # One name at a time, so that one failing plugin does not hide the others.
                pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
            except Exception as e:
                logger.error(f"plugin {name} failed to load and is skipped: {describe(e)}")
                host.failures.append(PluginFailure(name=name, error=describe(e)))
                if (plugin := pm.get_plugin(name)) is not None:
                    pm.unregister(plugin)
    core = [n for n, _ in CORE_PLUGINS]
    for name in disabled:
        if name not in names and name not in core:
            known = ", ".join(names) or "none"
            host.warn(f"--disable-plugin {name}: no plugin has that name (installed: {known})")
    for name, plugin in pm.list_name_plugin():
        if plugin is not None and name not in core:
            host.check_hook_names(plugin)
    return host
