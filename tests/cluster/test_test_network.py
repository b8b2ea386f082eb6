"""The test network itself (exo_core.testing.network): links carry, cut and heal; everything it
made is gone after a failure, and a network left by a dead process is swept. Needs root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import (
    EmulatedNetwork,
    emulated_network,
    network_problem,
    sweep_stale,
)

pytestmark = pytest.mark.network

if (problem := network_problem()) is not None:
    pytest.skip(f"no test network here: {problem}", allow_module_level=True)

# Host 0 connects to host 1's port and prints what it gets back (or the error).
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7001), timeout=1.5) as s:
        s.sendall(b"ping"); print(s.recv(4).decode())
except OSError as e:
    print(type(e).__name__)
"""
ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7001)); s.listen(); print("up", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.recv(4)); c.close()
"""


def connect(net: EmulatedNetwork, a: int, b: int) -> str:
    out = subprocess.run(
        [*net.hosts[a].exec_prefix(), sys.executable, "-c", CONNECT, net.hosts[b].address],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return out.stdout.strip()


def ours() -> str:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return listing + links


def test_links_carry_cut_and_heal_and_everything_goes_after_a_failure() -> None:
    tag = ""
    with pytest.raises(RuntimeError, match="a failing test"), emulated_network(3) as net:
        tag = net.hosts[0].namespace.rsplit("-", 1)[0]
        echo = net.popen(1, [sys.executable, "-c", ECHO], stdout=subprocess.PIPE)
        assert echo.stdout is not None and echo.stdout.readline() == b"up\n"
        assert connect(net, 0, 1) == "ping"
        net.cut(0, 1)
        assert connect(net, 0, 1) in {"TimeoutError", "timeout"}
        assert connect(net, 2, 1) == "ping", "a cut link cuts only its own pair"
        net.heal_all()
        net.set_link(LinkSpec(delay_ms=5, loss=0.0))
        assert connect(net, 0, 1) == "ping"
        assert net.stats()["cut"] > 0
        raise RuntimeError("a failing test")
    assert tag and tag not in ours(), "a namespace or link outlived its network"


def test_a_network_of_a_dead_process_is_swept() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    name = f"exn{dead}z-0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        sweep_stale()
        assert name not in ours()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
