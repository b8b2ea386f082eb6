"""What a node reports about itself: resources (psutil) and addresses."""

from __future__ import annotations

import platform
import socket

import psutil

from exo_core.ids import ModelId, RunnerId
from exo_core.state import NodeResources


def resident_memory(pids: dict[RunnerId, int]) -> dict[RunnerId, int]:
    """The resident set size of each process, in bytes (those gone meanwhile left out)."""
    out: dict[RunnerId, int] = {}
    for runner_id, pid in pids.items():
        try:
            out[runner_id] = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return out


def gather_resources(
    disk_path: str,
    engines: tuple[str, ...],
    serves: tuple[ModelId, ...] | None = None,
    runner_pids: dict[RunnerId, int] | None = None,
) -> NodeResources:
    memory = psutil.virtual_memory()
    try:
        disk = psutil.disk_usage(disk_path)
        disk_total, disk_free = disk.total, disk.free
    except OSError:
        disk_total = disk_free = 0
    return NodeResources(
        memory_total=memory.total,
        memory_available=memory.available,
        cpu_count=psutil.cpu_count() or 0,
        cpu_percent=psutil.cpu_percent(interval=None),
        disk_total=disk_total,
        disk_available=disk_free,
        os=f"{platform.system()} {platform.release()}",
        engines=engines,
        serves=serves,
        runner_memory=resident_memory(runner_pids or {}),
    )


def local_addresses(listen_host: str) -> tuple[str, ...]:
    """IPv4 addresses peers may reach us at; loopback first when we listen only there."""
    if listen_host.startswith("127."):
        return (listen_host,)
    found = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    return (*found, "127.0.0.1")


def hostname() -> str:
    return socket.gethostname()
