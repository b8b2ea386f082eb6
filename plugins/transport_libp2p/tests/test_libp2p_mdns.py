"""mDNS discovery between two network namespaces joined by a veth pair.

mDNS skips loopback, so this is the only way to test it on one machine. The namespaces, the
veth pair and the 10.213.7.0/30 addresses exist only inside this test: no traffic leaves them.
Needs root (CAP_NET_ADMIN) and iproute2; skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

NODE_SCRIPT = Path(__file__).with_name("mdns_node.py")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def two_namespaces() -> Iterator[tuple[str, str]]:
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns = (f"exo-mdns-a-{tag}", f"exo-mdns-b-{tag}")
    veth = (f"exoa{tag}", f"exob{tag}")
    created: list[str] = []
    try:
        for name in ns:
            try:
                ip("netns", "add", name)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot create network namespaces: {e.stderr.decode().strip()}")
            created.append(name)
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for name, dev, addr in zip(ns, veth, ("10.213.7.1/30", "10.213.7.2/30"), strict=True):
            ip("link", "set", dev, "netns", name)
            ip("-n", name, "addr", "add", addr, "dev", dev)
            ip("-n", name, "link", "set", dev, "up")
            ip("-n", name, "link", "set", "lo", "up")
            # Multicast (mDNS's 224.0.0.251) leaves through the veth, the only way out.
            ip("-n", name, "route", "add", "224.0.0.0/4", "dev", dev)
        yield ns
    finally:
        for name in created:  # deleting a namespace also deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_mdns_discovers_a_peer_in_another_namespace(
    two_namespaces: tuple[str, str], tmp_path: Path
) -> None:
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, str(NODE_SCRIPT), str(tmp_path / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in two_namespaces
    ]
    results: list[dict[str, object]] = []
    logs: list[str] = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        logs.append(err[-3000:])
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    a, b = results
    seen = f"{a}\n{b}\n--- a's log:\n{logs[0]}\n--- b's log:\n{logs[1]}"
    assert a["connected"] == [b["node_id"]], seen
    assert b["connected"] == [a["node_id"]], seen
    assert a["heard"] == [b["node_id"]] and b["heard"] == [a["node_id"]], seen
