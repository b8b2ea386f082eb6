"""Latency and throughput of the libp2p transport between two processes on loopback.

    uv run python bench/bench_transport_libp2p.py [--requests 1000] [--messages 20000]

A server process answers requests (echo) and counts broadcasts; this process measures:
request round trips (p50/p99 of sequential small requests), requests per second with many in
flight, 8 MiB request bandwidth, and gossipsub broadcasts per second as delivered to the server.
Prints figures only; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exo_core.transport.base import TransportMessage
from exo_transport_libp2p.transport import Libp2pTransport

TOPIC = "bench"


async def serve(data_dir: Path) -> None:
    node = Libp2pTransport(data_dir, "bench", listen_host="127.0.0.1", mdns=False)
    received = 0
    first = last = 0.0

    async def answer(sender: str, payload: bytes) -> bytes:
        if payload == b"stats":
            return json.dumps({"received": received, "first": first, "last": last}).encode()
        return payload

    node.set_request_handler(answer)
    await node.start()
    await node.subscribe(TOPIC)
    print(node.listen_addrs()[0], flush=True)

    async def count() -> None:
        nonlocal received, first, last
        async for event in node.events():
            if isinstance(event, TransportMessage) and event.payload != b"probe":
                now = time.perf_counter()
                received += 1
                first = first or now
                last = now

    counter = asyncio.create_task(count())
    # Run until the parent closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    counter.cancel()
    await node.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(args: argparse.Namespace, server_addr: str, data_dir: Path) -> None:
    node = Libp2pTransport(
        data_dir, "bench", listen_host="127.0.0.1", bootstrap_peers=[server_addr], mdns=False
    )
    await node.start()
    server = server_addr.rsplit("/p2p/", 1)[1]
    async with asyncio.timeout(10):
        while server not in node.peers():
            await asyncio.sleep(0.01)

    # Round trips, one request at a time.
    payload = b"x" * 64
    for _ in range(50):  # warm up
        await node.request(server, payload)
    rtts: list[float] = []
    for _ in range(args.requests):
        t0 = time.perf_counter()
        await node.request(server, payload)
        rtts.append(time.perf_counter() - t0)
    print(
        f"request RTT (64 B, sequential, n={args.requests}): "
        f"p50 {percentile(rtts, 0.5) * 1e6:.0f} us, p99 {percentile(rtts, 0.99) * 1e6:.0f} us, "
        f"mean {statistics.fmean(rtts) * 1e6:.0f} us"
    )

    # Requests per second with many in flight.
    total, in_flight = args.requests * 5, 64
    sem = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with sem:
            await node.request(server, payload)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    elapsed = time.perf_counter() - t0
    print(f"requests/s (64 B, {in_flight} in flight, n={total}): {total / elapsed:,.0f}")

    # Bandwidth with big requests (8 MiB there, 8 MiB back).
    big = bytes(8 * 1024 * 1024)
    t0 = time.perf_counter()
    rounds = 5
    for _ in range(rounds):
        await node.request(server, big, timeout=60)
    elapsed = time.perf_counter() - t0
    print(
        f"8 MiB request+echo: {elapsed / rounds * 1e3:.0f} ms each, "
        f"{2 * rounds * len(big) / elapsed / 1e6:,.0f} MB/s both ways"
    )

    # Broadcasts: wait until the server is subscribed, then publish.
    await node.subscribe(TOPIC)
    await asyncio.sleep(1.5)
    message = b"m" * args.message_size

    async def server_stats() -> dict[str, float]:
        return json.loads(await node.request(server, b"stats"))

    async def wait_received(target: int, timeout: float = 30) -> dict[str, float]:
        deadline = time.perf_counter() + timeout
        stats = await server_stats()
        while stats["received"] < target and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
            stats = await server_stats()
        return stats

    # 1. A burst as fast as Python can publish: gossipsub drops what its per-peer send queue
    #    (5,000 messages) cannot hold, so this shows the loss under overload.
    t0 = time.perf_counter()
    for _ in range(args.messages):
        await node.publish(TOPIC, message)
    publish_rate = args.messages / (time.perf_counter() - t0)
    stats = await wait_received(args.messages, timeout=10)
    delivered = int(stats["received"])
    span = stats["last"] - stats["first"]
    print(
        f"gossipsub burst ({args.message_size} B, n={args.messages}): published "
        f"{publish_rate:,.0f} msg/s; delivered {delivered} ({delivered / args.messages:.1%}) "
        f"at {delivered / span if span else 0:,.0f} msg/s"
    )

    # 2. Flow-controlled: never more than `window` messages ahead of what the server counted.
    window, before = 2000, delivered
    t0 = time.perf_counter()
    sent = 0
    while sent < args.messages:
        for _ in range(window // 2):
            await node.publish(TOPIC, message)
        sent += window // 2
        await wait_received(before + sent - window // 2)
    stats = await wait_received(before + sent, timeout=10)
    elapsed = time.perf_counter() - t0
    got = int(stats["received"]) - before
    print(
        f"gossipsub sustained ({args.message_size} B, n={sent}, window {window}): "
        f"{got / elapsed:,.0f} msg/s delivered ({got / sent:.1%})"
    )
    await node.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--message-size", type=int, default=256)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        await serve(args.serve)
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(Path(tmp) / "server")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert server.stdout is not None
            addr = server.stdout.readline().strip()
            await measure(args, addr, Path(tmp) / "client")
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
