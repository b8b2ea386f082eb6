"""A dead ring peer is noticed within a second: the probe of the ring's connections
(`ring_peers_lost`) and the watchdog that asks it during a long guarded wait. And the ring's
sockets wait in the kernel, not in a spinning thread (`calm_ring_sockets`).

MLX's ring does not always fail a collective when its peer dies (a socket's thread that saw the
peer go ends, and a collective queued there later waits forever); test_distributed.py's
`test_killing_a_rank_mid_generation...` covers the whole runner group."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo_core.plugin.engine import Watchdog, ring_peers_lost
from exo_core.ring import calm_ring_sockets
from exo_engine_mlx.distributed.testing import free_ports, group_specs


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[tuple[list[int], list[socket.socket]]]:
    """Rank 0's side of a 2-rank ring in this process (its two connections, one accepted on
    its address, one made to rank 1's), and rank 1's ends of them."""
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    ports = free_ports(2)
    listeners = []
    for port in ports:
        s = socket.create_server(("127.0.0.1", port))
        listeners.append(s)
    peer_connects = socket.create_connection(("127.0.0.1", ports[0]))
    ours_accepted, _ = listeners[0].accept()
    ours_connects = socket.create_connection(("127.0.0.1", ports[1]))
    peer_accepted, _ = listeners[1].accept()
    sockets = [peer_connects, ours_accepted, ours_connects, peer_accepted, *listeners]
    try:
        yield ports, [peer_connects, peer_accepted, ours_accepted, ours_connects]
    finally:
        for s in sockets:
            s.close()


def test_the_probe_names_the_peer_whose_connection_closed(
    tmp_path: Path, ring: tuple[list[int], list[socket.socket]]
) -> None:
    ports, ends = ring
    spec = group_specs(tmp_path, sharding="pipeline", world=2, ports=ports)[0]
    lost = ring_peers_lost(spec)
    assert lost() is None
    for s in ends[:2]:
        s.close()  # as the kernel closes a killed process's sockets
    deadline = time.monotonic() + 5
    while (words := lost()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert words is not None and "the connection to a peer was lost" in words, words


def test_a_watchdog_ends_a_long_wait_when_its_probe_sees_a_peer_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = threading.Event()
    monkeypatch.setattr("exo_core.watchdog.os", types.SimpleNamespace(_exit=lambda _: ended.set()))
    messages: list[str] = []
    asked: list[float] = []

    def probe() -> str | None:
        asked.append(time.monotonic())
        return "the connection to a peer was lost (rank 1)"

    watchdog = Watchdog(messages.append, poll_s=0.05, probe_after_s=0.3)
    watchdog.watch(probe)
    with watchdog.guard("a step of the runner group", 60.0):
        started = time.monotonic()
        assert ended.wait(10), "the watchdog did not end the wait"
    # (os._exit is stubbed, so the watchdog may say it again before the guard ends)
    assert messages[0] == (
        "a step of the runner group failed: the connection to a peer was lost (rank 1)"
    )
    assert asked[0] - started >= 0.3  # a short step is never probed


@pytest.mark.skipif(sys.platform != "linux", reason="changed on Linux only")
def test_the_ring_sockets_wait_in_the_kernel_with_a_short_timeout(
    tmp_path: Path, ring: tuple[list[int], list[socket.socket]]
) -> None:
    ports, ends = ring
    ours = ends[2:]
    for s in ours:
        s.setblocking(False)  # as MLX's ring leaves them
    spec = group_specs(tmp_path, sharding="pipeline", world=2, ports=ports)[0]
    assert calm_ring_sockets(spec) == 2  # rank 0's two, not the peer's ends
    for s in ours:
        assert not fcntl.fcntl(s.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        seconds, micros = struct.unpack(
            "ll", s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
        )
        assert seconds == 0 and 0 < micros <= 10_000  # 1 ms, rounded up to a kernel tick
    for s in ends[:2]:
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)
