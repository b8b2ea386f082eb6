"""Fixtures of this plugin's tests."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from exo_core.plugin.transport import Transport
from exo_transport_libp2p.testing import libp2p_cluster

Cluster = Callable[[int], AbstractAsyncContextManager[list[Transport]]]


@pytest.fixture
def transport_cluster(tmp_path: Path) -> Cluster:
    """What the core's conformance suite asks for: started, fully connected loopback nodes."""
    return lambda n: libp2p_cluster(tmp_path, n)
