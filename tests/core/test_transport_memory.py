"""The in-memory transport passes the transport conformance suite."""

import contextlib
from collections.abc import AsyncIterator

import pytest

from exo_core.testing.transport_conformance import *  # noqa: F403
from exo_core.transport.base import Transport
from exo_core.transport.memory import MemoryNetwork


@contextlib.asynccontextmanager
async def memory_cluster(n: int) -> AsyncIterator[list[Transport]]:
    network = MemoryNetwork(seed=1)
    nodes: list[Transport] = [network.transport(f"node-{i}") for i in range(n)]
    for node in nodes:
        await node.start()
    try:
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


@pytest.fixture
def transport_cluster():
    return memory_cluster
