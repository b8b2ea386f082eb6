"""Running a node with its API: the pieces the CLI and tests share."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import anyio
import uvicorn
from loguru import logger

from exo_core.api.app import create_app
from exo_core.api.connections import (
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_S,
    bounded_protocol,
    connection_cap,
    listening_socket,
    quiet_asyncio_accept_failures,
    raise_open_file_limit,
)
from exo_core.config import NodeConfig
from exo_core.datadir import DataDirLock
from exo_core.node import Node
from exo_core.plugin_host import PluginHost

# How long a node may take to stop after SIGINT or SIGTERM before the process exits anyway.
STOP_GRACE_S = 30.0


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The node handles signals itself, so that runners are ended before exit.
        yield


async def serve_api(node: Node) -> None:
    config = node.config
    app = create_app(node)
    # Connections are bounded (see exo_core.api.connections): a cap below the open-file limit,
    # a header-read timeout and a short keep-alive.
    cap = connection_cap(config.max_connections, raise_open_file_limit())
    quiet_asyncio_accept_failures()
    uv_config = uvicorn.Config(
        app,
        host=config.api_host,
        port=config.api_port,
        log_config=None,
        timeout_graceful_shutdown=2,
        lifespan="on",
        http=bounded_protocol(HEADER_TIMEOUT_S),
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = _Uvicorn(uv_config)
    failed: list[BaseException] = []

    async def serve() -> None:
        # Shielded: on cancellation uvicorn is asked to exit and closes its connections itself.
        with anyio.CancelScope(shield=True):
            try:
                sock = listening_socket(uv_config.bind_socket(), cap)
                sock.set_inheritable(False)  # runners must not hold the API's port
                await server.serve(sockets=[sock])
            except (SystemExit, OSError) as e:  # uvicorn exits when it cannot bind
                failed.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        try:
            while not server.started and not failed:
                await anyio.sleep(0.05)
            if failed:
                raise RuntimeError(
                    f"the API could not listen on {config.api_host}:{config.api_port} "
                    "(is the port taken?)"
                )
            await anyio.sleep_forever()
        finally:
            server.should_exit = True
    logger.info("API stopped")


async def run_node(
    config: NodeConfig, plugins: PluginHost, data_lock: DataDirLock | None = None
) -> None:
    """Run a node (and its API unless disabled) until SIGINT or SIGTERM."""
    import signal

    node = Node(config, plugins, data_lock=data_lock)
    extra = []
    if config.api:
        extra.append(lambda: serve_api(node))
        logger.info(f"API on http://{config.api_host}:{config.api_port}")
    deadline: list[threading.Timer] = []
    try:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        logger.info(f"received {signal.Signals(signum).name}; stopping")
                        deadline.append(_exit_unless_stopped_within(STOP_GRACE_S))
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            await node.run(extra=extra)
    finally:
        for timer in deadline:
            timer.cancel()


def _exit_unless_stopped_within(seconds: float) -> threading.Timer:
    """A signal always stops the node: if stopping hangs (a runner or a connection that will
    not end), the process exits anyway after `seconds`."""

    def force() -> None:
        logger.error(f"the node did not stop within {seconds:.0f}s of the signal; exiting now")
        os._exit(1)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()
    return timer
