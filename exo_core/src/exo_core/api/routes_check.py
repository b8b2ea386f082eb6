"""Which plugins' routes an app takes: the node's (`api.app`) and `exo plugins`' (a trial app).

A plugin whose handlers Litestar refuses is left out with Litestar's reason. A plugin with a
route that the core or an earlier plugin already serves is left out too, and the report names
both: the plugin that took the path (a warning on it) and the one left out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Litestar

from exo_core.api.exo_routes import ExoRoutesController
from exo_core.api.native import NativeController
from exo_core.plugin_host import PluginHost

Route = tuple[str, str]
"""(method, path); WEBSOCKET for a websocket route."""

CORE = "the core"
# The native API's controllers: this project's routes, and exo's own instance routes.
CORE_CONTROLLERS: list[Any] = [NativeController, ExoRoutesController]


class RouteClash(Exception):
    """A plugin's route is served already by the core or another plugin."""


def route_keys(app: Litestar) -> set[Route]:
    """The (method, path) pairs an app serves, less the OPTIONS Litestar adds to each path."""
    keys: set[Route] = set()
    for route in app.routes:
        methods = getattr(route, "methods", None) or {"WEBSOCKET"}
        keys.update((m, route.path) for m in methods if m != "OPTIONS")
    return keys


def accepted_routes(
    plugins: PluginHost,
    contributed: list[tuple[str, list[Any]]],
    trial: Callable[[list[Any]], Litestar],
) -> list[Any]:
    """The handlers of every plugin in `contributed` (in order) that `trial` accepts alone and
    beside those accepted before it, and whose routes no one serves yet."""
    base = route_keys(trial([]))
    owners: dict[Route, str] = dict.fromkeys(route_keys(trial(CORE_CONTROLLERS)) - base, CORE)
    accepted: list[Any] = []
    for name, mine in contributed:
        ok, app = plugins.attempt(name, "exo_routes", trial, leave_out=True, handlers=mine)
        if not ok:
            continue
        keys = route_keys(app) - base
        taken = sorted(k for k in keys if k in owners)
        if taken:
            _report_clash(plugins, name, taken, owners)
            continue
        # Beside the others (dependency names, handler names) as the real app will have them.
        ok, _ = plugins.attempt(
            name,
            "exo_routes",
            trial,
            leave_out=True,
            handlers=[*CORE_CONTROLLERS, *accepted, *mine],
        )
        if ok:
            owners.update(dict.fromkeys(keys, name))
            accepted.extend(mine)
    return accepted


def _report_clash(
    plugins: PluginHost, loser: str, taken: list[Route], owners: dict[Route, str]
) -> None:
    method, path = taken[0]
    holder = owners[taken[0]]
    more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
    holder_named = holder if holder == CORE else f"plugin {holder}"
    if holder != CORE:
        plugins.warn(
            f"plugin {holder}: took {method} {path}{more} first, which plugin {loser} also serves;"
            f" {loser}'s routes are left out"
        )
    clash = RouteClash(f"{method} {path}{more} is served by {holder_named} already")
    plugins.fail(loser, "exo_routes", clash, leave_out=True)
