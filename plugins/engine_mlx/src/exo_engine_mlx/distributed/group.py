"""Forming a runner group: the ring hostfile, the runner's environment, and a bounded init.

The master gives every rank a `host:port` (`ShardAssignment.ring_address`). The worker side
writes them to a hostfile and starts the runner with MLX_HOSTFILE and MLX_RANK in its own
environment only. The runner then joins the ring; when a peer never shows up the attempt ends
after `timeout_s` instead of blocking forever.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
from pathlib import Path
from typing import IO

import mlx.core as mx

from exo_core.plugin import Instance, RunnerSpec

# Exit status of a runner whose group did not form in time (faulthandler's own).
CONNECT_TIMEOUT_EXIT = 1
_devnull: IO[str] | None = None


class GroupError(RuntimeError):
    """The group could not form; the message says which rank, address and why."""


def ring_addresses(instance: Instance) -> list[str]:
    """`host:port` of every rank, in rank order."""
    shards = sorted(instance.shards, key=lambda s: s.rank)
    missing = [s.rank for s in shards if not s.ring_address]
    if missing:
        raise GroupError(f"instance {instance.instance_id} has no ring address for ranks {missing}")
    return [s.ring_address for s in shards]


def write_hostfile(instance: Instance, directory: Path) -> Path:
    """The ring backend's hostfile: one list of addresses per rank."""
    path = Path(directory) / f"hostfile-{instance.instance_id}.json"
    path.write_text(json.dumps([[a] for a in ring_addresses(instance)]))
    return path


def group_env(spec: RunnerSpec, directory: Path) -> dict[str, str]:
    """What a runner of a multi-rank instance needs in its environment to join the ring."""
    hostfile = write_hostfile(spec.instance, directory)
    return {"MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(spec.shard.rank)}


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_port(address: str) -> None:
    """Fail now, and clearly, when our ring port cannot be listened on."""
    host, port = _split(address)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise GroupError(f"cannot listen on ring address {address}: {e.strerror}") from e


def form_group(spec: RunnerSpec, timeout_s: float) -> mx.distributed.Group:
    """Join the ring of `spec.instance` as `spec.shard.rank`, within `timeout_s` seconds.

    `mx.distributed.init` holds the GIL while it waits for peers, so no Python thread can end
    it: faulthandler's C timer ends the process instead (exit status 1), and the parent turns
    that into a clear error since it knows we were connecting."""
    global _devnull
    shard = spec.shard
    if os.environ.get("MLX_RANK") != str(shard.rank) or not os.environ.get("MLX_HOSTFILE"):
        raise GroupError("the runner was started without MLX_HOSTFILE/MLX_RANK for its rank")
    check_port(shard.ring_address)
    _devnull = _devnull or open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.dump_traceback_later(timeout_s, exit=True, file=_devnull)
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    except RuntimeError as e:
        raise GroupError(f"rank {shard.rank} could not join the ring: {e}") from e
    finally:
        faulthandler.cancel_dump_traceback_later()
    if (group.rank(), group.size()) != (shard.rank, shard.world_size):
        raise GroupError(
            f"joined as rank {group.rank()} of {group.size()}, "
            f"expected {shard.rank} of {shard.world_size}"
        )
    return group


def barrier(group: mx.distributed.Group) -> None:
    """Return when every rank got here (fails when a peer is gone)."""
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
