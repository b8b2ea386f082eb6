"""How a node runs its background tasks: none of them ends the node by raising.

A task that can start over (telemetry, catching up, the election, receiving from peers) is
restarted after a pause that doubles up to `MAX_PAUSE_S`, each failure logged with its
traceback: a passing fault (out of file descriptors under a flood of connections, a /proc
read that fails) costs a report or two, not the node. A task the node cannot go on without
(the worker, the API) ends it, and the log says which and why.
"""

from __future__ import annotations

import errno
import resource
from collections.abc import Awaitable, Callable

import anyio
from loguru import logger

from exo_core.plugin_host import describe

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0


class NodeCannotGoOn(RuntimeError):
    """A task the node needs failed: the node stops, saying why."""


def explain(e: BaseException) -> str:
    """The cause in one line, with the open-file limit when descriptors ran out."""
    text = describe(e)
    if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        text += f" (out of file descriptors; the open-file limit is {soft})"
    return text


async def keep_running(
    name: str,
    task: Callable[[], Awaitable[None]],
    *,
    first_pause_s: float = FIRST_PAUSE_S,
    max_pause_s: float = MAX_PAUSE_S,
) -> None:
    """Run `task` until it returns; when it raises, log it and start it again after a pause
    (doubling from `first_pause_s` up to `max_pause_s`; back to the first after a task that
    ran longer than the longest pause). `NodeCannotGoOn` is not retried."""
    pause = first_pause_s
    while True:
        started = anyio.current_time()
        try:
            await task()
            return
        except NodeCannotGoOn:
            raise
        except Exception as e:
            if anyio.current_time() - started > max_pause_s:
                pause = first_pause_s
            logger.opt(exception=e).error(
                f"{name} failed: {explain(e)}; starting it again in {pause:.0f} s"
            )
        await anyio.sleep(pause)
        pause = min(pause * 2, max_pause_s)


async def essential(name: str, task: Callable[[], Awaitable[None]]) -> None:
    """Run `task`, which the node cannot go on without: when it raises, the node stops with
    `NodeCannotGoOn` naming it, after logging why."""
    try:
        await task()
    except NodeCannotGoOn:
        raise
    except Exception as e:
        logger.opt(exception=e).error(f"the node cannot go on: {name} failed: {explain(e)}")
        raise NodeCannotGoOn(f"{name} failed: {explain(e)}") from e


__all__ = ["NodeCannotGoOn", "essential", "explain", "keep_running"]
