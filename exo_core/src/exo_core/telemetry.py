"""What a node reports about itself: resources (psutil) and addresses."""

from __future__ import annotations

import platform
import re
import socket

import msgspec
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


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from a size such as `600MB`, `1.5GiB`, `512k` or `1000000` (kB, MB, GB, TB are
    powers of 1000, KiB, MiB, GiB, TiB of 1024)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (e.g. 600MB, 1.5GiB)")
    number, prefix, binary = match.groups()
    power = "kmgt".find(prefix.lower()) + 1 if prefix else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


def cap_memory(resources: NodeResources, max_memory: int | None) -> NodeResources:
    """The resources as a node offers them when it may use at most `max_memory` bytes: its
    total is the cap, and what is free is the cap less its runners' resident memory (and
    never more than the machine has free)."""
    if max_memory is None:
        return resources
    used = sum(resources.runner_memory.values())
    return msgspec.structs.replace(
        resources,
        memory_total=min(resources.memory_total, max_memory),
        memory_available=max(0, min(resources.memory_available, max_memory - used)),
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
