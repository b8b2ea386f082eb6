"""Forming a runner group: the ring hostfile, the runner's environment, and a bounded init.

Shared by every engine whose runners join an mx.distributed ring (the MLX text engine, the
mflux image engine). MLX is imported only inside the functions that use it: the node process
imports this module for the hostfile and token, and the core does not depend on MLX.

The master gives every rank a `host:port` (`ShardAssignment.ring_address`). The worker side
writes them to a hostfile and starts the runner with MLX_HOSTFILE and MLX_RANK in its own
environment only. The runner then joins the ring; when a peer never shows up the attempt ends
after `timeout_s` instead of blocking forever.

**Only members.** MLX's ring accepts the first connection to a rank's port, from anyone, and
then closes the port. So right after the ring forms, every rank proves it holds the group's
token (`EXO_RING_TOKEN`, derived from the cluster key and the instance id; see
`ring_token`) before any model data flows: each rank adds a fresh nonce, then each shows an
HMAC of all nonces under the token. A stranger that took a peer's place cannot show one, and
the group fails with a clear error instead of computing with it. (The connections are plain
TCP: someone on the path between the machines can still read them.)
"""

from __future__ import annotations

import faulthandler
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from exo_core.engine import RunnerSpec
from exo_core.generation import Chunk, ErrorChunk, FinishChunk
from exo_core.ids import TaskId
from exo_core.state import Instance, RunnerStatus
from exo_core.subprocess_runner import (
    RunnerShutdown,
    SubprocessRunner,
    ToRunner,
    start_request_reader,
)

if TYPE_CHECKING:
    import mlx.core as mx

# Exit status of a runner whose group did not form in time (faulthandler's own).
CONNECT_TIMEOUT_EXIT = 1
# The environment variable that carries a runner's ring token.
RING_TOKEN_ENV = "EXO_RING_TOKEN"
"""The environment variable that hands a runner its ring token (see `ring_token`)."""
_NONCE_BYTES = 16
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
    import mlx.core as mx

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
    import mlx.core as mx

    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))


def ring_token(ring_secret: bytes, instance_id: str) -> str:
    """The token every rank of one instance holds: only holders of the cluster key can make it,
    and it differs for every instance."""
    return hmac.new(ring_secret, f"instance:{instance_id}".encode(), hashlib.sha256).hexdigest()


def _all_gather(group: mx.distributed.Group, data: bytes) -> list[bytes]:
    """Every rank's `data` (all of one length), by rank."""
    import mlx.core as mx
    import numpy as np

    gathered = mx.distributed.all_gather(
        mx.array(list(data), dtype=mx.uint8), group=group, stream=mx.cpu
    )
    raw = np.asarray(gathered, dtype=np.uint8).tobytes()
    n = len(data)
    return [raw[r * n : (r + 1) * n] for r in range(group.size())]


def prove_membership(group: mx.distributed.Group, token: str) -> None:
    """Check that every rank of the ring holds `token` (a barrier too). Raises GroupError."""
    rank = group.rank()
    nonce = secrets.token_bytes(_NONCE_BYTES)
    nonces = _all_gather(group, nonce)
    key = token.encode()

    def proof(of_rank: int) -> bytes:
        transcript = b"".join(nonces) + of_rank.to_bytes(4, "big")
        return hmac.new(key, transcript, hashlib.sha256).digest()

    proofs = _all_gather(group, proof(rank))
    strangers = [
        r for r in range(group.size()) if r != rank and not hmac.compare_digest(proofs[r], proof(r))
    ]
    if nonces[rank] != nonce or strangers:
        raise GroupError(
            f"rank {rank}: the ring holds a peer that cannot prove it belongs to the group "
            f"(ranks {strangers or 'unknown'}): a stranger connected to a ring port, or the "
            "nodes run with different cluster keys"
        )


def join_group(
    spec: RunnerSpec,
    timeout_s: float,
    guard: Callable[[str, float], AbstractContextManager[None]],
) -> mx.distributed.Group:
    """Form the group of `spec` and check its members (`guard`: a watchdog's deadline)."""
    group = form_group(spec, timeout_s)
    with guard("joining the runner group", timeout_s):
        prove_membership(group, os.environ.get(RING_TOKEN_ENV, ""))
    calm_ring_sockets(spec)
    return group


def _ring_connections(spec: RunnerSpec) -> tuple[Callable[[], list[Any]], dict[Any, int]]:
    """A lister of this rank's ring TCP connections (psutil's: address pair, status, fd): those
    made with its own ring address or with a peer's; and the peers' addresses, with their ranks."""
    import psutil

    addresses = ring_addresses(spec.instance)
    own = _split(addresses[spec.shard.rank])
    peers = {_split(a): rank for rank, a in enumerate(addresses) if rank != spec.shard.rank}
    process = psutil.Process()

    def connections() -> list[Any]:
        return [
            c
            for c in process.net_connections(kind="tcp")
            if c.raddr and ((c.laddr.ip, c.laddr.port) == own or tuple(c.raddr) in peers)
        ]

    return connections, peers


def ring_peers_lost(spec: RunnerSpec) -> Callable[[], str | None]:
    """A probe for `Watchdog.watch`: words when a TCP connection of this rank's ring (those
    made with its address or with a peer's, established when this is called, after the group
    formed) has been closed by the peer or reset, else None. A peer process that dies has its
    connections closed by its kernel; a machine that vanishes closes none (the deadline then)."""
    import psutil

    connections, peers = _ring_connections(spec)

    def statuses() -> dict[tuple[Any, Any], str]:
        return {(tuple(c.laddr), tuple(c.raddr)): c.status for c in connections()}

    established = [k for k, v in statuses().items() if v == psutil.CONN_ESTABLISHED]

    def lost() -> str | None:
        now = statuses()
        for key in established:
            status = now.get(key)
            if status == psutil.CONN_ESTABLISHED:
                continue
            remote = key[1]
            who = f"rank {peers[remote]}" if remote in peers else f"the peer at {remote[0]}"
            how = "reset" if status is None else f"closed by the peer ({status})"
            return f"the connection to a peer was lost ({who}: {how})"
        return None

    return lost


# How long a ring socket's thread waits in the kernel for data before it turns to its queued
# sends (see `calm_ring_sockets`).
SOCKET_WAIT_S = 0.001


def calm_ring_sockets(spec: RunnerSpec) -> int:
    """Make this rank's ring sockets wait in the kernel instead of spinning. MLX's ring gives
    each socket a thread that, while a transfer is pending, calls a non-blocking recv or send
    in a loop: a whole core spent on waiting for the peer, taken from the node and from this
    rank's own next step where they share it. Blocking with a 1 ms timeout, the thread sleeps
    until data comes (no added latency) and still turns to a queued send within a kernel tick
    (1 ms asked, a few ms given); a peer that closes still fails the transfer at once. Linux only (struct timeval's layout);
    returns how many sockets were changed."""
    if sys.platform != "linux":
        return 0
    connections, _ = _ring_connections(spec)
    wait = struct.pack("ll", 0, round(SOCKET_WAIT_S * 1_000_000))
    changed = 0
    for c in connections():
        if c.fd < 0:
            continue
        s = socket.socket(fileno=os.dup(c.fd))  # the same socket; closing the copy keeps it
        try:
            s.setblocking(True)  # clears O_NONBLOCK, which the descriptors share
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait)
            changed += 1
        finally:
            s.close()
    return changed


def start_rank_reader(
    conn: Connection, deliver: Callable[[ToRunner], None], in_group: bool, rank: int
) -> None:
    """The runner's request reader; a rank of a group leaves at once when its parent goes or
    (not rank 0) when told to stop: its main thread may sit in a collective for a while."""

    def on_message(message: ToRunner) -> None:
        deliver(message)
        if isinstance(message, RunnerShutdown) and in_group and rank != 0:
            os._exit(0)

    def closed() -> None:
        if in_group:
            os._exit(0)  # the parent is gone; a collective may block the main thread
        deliver(RunnerShutdown())

    start_request_reader(conn, on_message, closed)


# -- rank 0's bytes on every rank ---------------------------------------------------------------

# The first exchange carries up to this many bytes; longer payloads take a second.
HEAD_BYTES = 1024
_LEN = struct.Struct("<I")


def _all_sum_bytes(data: bytes, size: int, group: mx.distributed.Group, stream: Any) -> bytes:
    import mlx.core as mx
    import numpy as np

    buffer = np.zeros(size, dtype=np.uint8)
    buffer[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    out = mx.distributed.all_sum(mx.array(buffer), group=group, stream=stream)
    mx.eval(out)
    return bytes(np.array(out, copy=False))


def broadcast(group: mx.distributed.Group, payload: bytes | None, stream: Any = None) -> bytes:
    """Rank 0's `payload` on every rank (others pass None). Sums with zeros: exact for bytes.

    `stream`: where the sums run (an engine whose model runs collectives asynchronously on its
    own stream passes that one: collectives must reach every rank in the same order)."""
    import mlx.core as mx

    stream = mx.cpu if stream is None else stream
    leader = group.rank() == 0
    data = _LEN.pack(len(payload)) + payload if leader and payload is not None else b""
    head = _all_sum_bytes(data[:HEAD_BYTES], HEAD_BYTES, group, stream)
    (length,) = _LEN.unpack_from(head)
    total = _LEN.size + length
    if total <= HEAD_BYTES:
        return head[_LEN.size : total]
    rest = _all_sum_bytes(data[HEAD_BYTES:], total - HEAD_BYTES, group, stream)
    return head[_LEN.size :] + rest


def any_rank(group: mx.distributed.Group, flag: bool) -> bool:
    """Whether `flag` is set on any rank (a vote every rank takes at the same point)."""
    import mlx.core as mx

    votes = mx.distributed.all_sum(mx.array(1 if flag else 0), group=group, stream=mx.cpu)
    return votes.item() != 0


# -- the worker's side of a rank ----------------------------------------------------------------


@dataclass
class FollowerFinals:
    """A follower rank's answers to its worker: the final chunk of each task, once the worker
    has submitted it (rank 0 may finish a task before this rank's worker asks for it)."""

    send: Callable[[Chunk], None]
    limit: int = 1024  # finals kept for tasks the worker has not submitted yet
    awaiting: set[TaskId] = field(default_factory=set)
    finals: OrderedDict[TaskId, Chunk] = field(default_factory=OrderedDict)

    def waits(self, task_id: TaskId) -> None:
        final = self.finals.pop(task_id, None)
        if final is not None:
            self.send(final)
        else:
            self.awaiting.add(task_id)

    def chunk(self, chunk: Chunk) -> None:
        """A chunk of the group's generation: only the final one goes to the worker."""
        if not isinstance(chunk, FinishChunk | ErrorChunk):
            return
        if chunk.task_id in self.awaiting:
            self.awaiting.discard(chunk.task_id)
            self.send(chunk)
            return
        self.finals[chunk.task_id] = chunk
        while len(self.finals) > self.limit:
            self.finals.popitem(last=False)


class GroupRunner(SubprocessRunner):
    """A `SubprocessRunner` that may be one rank of a group: such a rank gets its ring
    hostfile in its environment, and an exit while it connected says which peers it waited
    for."""

    # How long the runner waits for its peers (its own timer ends it after that).
    connect_timeout_s: float = 60.0
    _scratch: str | None = None

    def child_env(self) -> Mapping[str, str]:
        """The runner's environment; a rank of a group also gets its ring hostfile."""
        if self.spec.shard.world_size <= 1:
            return self.env
        self._scratch = tempfile.mkdtemp(prefix=f"exo-{self.spec.runner_id}-")
        return {**self.env, **group_env(self.spec, Path(self._scratch))}

    def exit_reason(self, exit_code: int | None) -> str:
        if self.status == RunnerStatus.CONNECTING:
            # The runner's own timer ended it while it waited for its peers.
            peers = ", ".join(ring_addresses(self.spec.instance))
            return (
                f"the runner group did not form within {self.connect_timeout_s:g} s: "
                f"rank {self.spec.shard.rank} could not connect to its peers ({peers}); "
                "a peer is unreachable, not started, or its port is taken"
            )
        return super().exit_reason(exit_code)

    async def stop(self) -> None:
        await super().stop()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
