"""The test network's own speed: TCP round trip and bulk throughput between two namespaces,
through the link emulator (exo_core.testing.network) beside a plain veth pair (the kernel
alone), with no emulated delay and with 1 ms a hop.

    sudo .venv/bin/python bench/bench_test_network.py [--rounds 2000] [--megabytes 200]

Needs root. Prints one row per setup: median and p99 round trip of a 1-byte TCP ping-pong
(TCP_NODELAY), and MB/s of one TCP stream."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import emulated_network

PEER = r"""
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(); print("up", flush=True)
    for _ in range(2):
        c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = c.recv(1)
        if kind == b"p":
            while (b := c.recv(1)): c.sendall(b)
        else:
            while c.recv(1 << 20): pass
            c.sendall(b"d")
        c.close()
else:
    c = socket.create_connection((host, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"p"); rtts = []
    for _ in range(n):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
    c.close()
    print(" ".join(f"{r:.6f}" for r in rtts))
    c = socket.create_connection((host, port)); c.sendall(b"b")
    block, total = b"\0" * (1 << 20), int(sys.argv[5]) << 20
    t = time.perf_counter(); sent = 0
    while sent < total: c.sendall(block); sent += len(block)
    c.shutdown(socket.SHUT_WR); c.recv(1)
    print(f"{total / (time.perf_counter() - t) / 1e6:.1f}")
"""


def measure(server: list[str], client: list[str], address: str, rounds: int, mb: int) -> str:
    srv = subprocess.Popen(
        [*server, sys.executable, "-c", PEER, "serve", address, "5201", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert srv.stdout is not None
        srv.stdout.readline()
        out = subprocess.run(
            [*client, sys.executable, "-c", PEER, "go", address, "5201", str(rounds), str(mb)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()
    finally:
        srv.kill()
        srv.wait()
    rtts = sorted(float(x) * 1000 for x in out[0].split())
    p99 = rtts[int(len(rtts) * 0.99) - 1]
    return f"rtt median {statistics.median(rtts):6.3f} ms  p99 {p99:6.3f} ms  {out[1]:>7} MB/s"


@contextlib.contextmanager
def veth_pair() -> Iterator[tuple[list[str], list[str]]]:
    """Two namespaces on a plain veth pair: what the kernel gives without the emulator."""
    names = ["exnbenchveth-a", "exnbenchveth-b"]
    try:
        for ns in names:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(
            ["ip", "link", "add", "exnbva", "type", "veth", "peer", "name", "exnbvb"], check=True
        )
        for ns, dev, addr in zip(
            names, ["exnbva", "exnbvb"], ["198.18.0.1", "198.18.0.2"], strict=True
        ):
            subprocess.run(["ip", "link", "set", dev, "netns", ns], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        yield (["ip", "netns", "exec", names[1]], ["ip", "netns", "exec", names[0]])
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--megabytes", type=int, default=200)
    args = parser.parse_args()
    with veth_pair() as (server, client):
        print(
            f"{'veth pair (kernel only)':34} {measure(server, client, '198.18.0.2', args.rounds, args.megabytes)}"
        )
    for spec, label in [
        (LinkSpec(), "emulator, no delay"),
        (LinkSpec(delay_ms=1), "emulator, 1 ms a hop"),
    ]:
        with emulated_network(2, spec) as net:
            a, b = net.hosts
            time.sleep(0.2)
            row = measure(b.exec_prefix(), a.exec_prefix(), b.address, args.rounds, args.megabytes)
            print(f"{label:34} {row}  {net.stats()}")


if __name__ == "__main__":
    main()
