"""`Libp2pTransport`: the core's `Transport` over rust-libp2p.

The swarm runs in Rust on its own tokio runtime (see `src/node.rs`); this class adapts it to
the core's interface:

* broadcasts are signed gossipsub messages (strict validation); a node never hears its own;
* requests use a length-prefixed request-response protocol (payloads up to 64 MiB by
  default), answered by the handler set with `set_request_handler`;
* what arrives is read in batches from a bounded native queue: when this node reads too
  slowly, broadcasts are dropped and a `TransportLagged` marks the gap, never a silent loss;
* nodes of different clusters never connect: the cluster key and the namespace key a libp2p
  private network (`exo_core.cluster_key.network_key`); without a cluster key, the namespace
  alone does, and anyone who knows it can join.

**Identity.** The node's Ed25519 key lives in `<data_dir>/libp2p_identity.key` (mode 0600).
A copied data directory would give two nodes one identity. So the constructor, before anyone
reads `node_id`, probes the bootstrap peers: it runs the handshakes up to noise (which reveals
the remote's peer id) and hangs up, so a legitimate peer never sees the probe as a connection.
If one answers with our own peer id, this node, the one starting and so the younger, takes a
fresh key. That blocks the constructor for up to `bootstrap_wait` seconds, and only when
bootstrap peers are configured and silent. A clash found later (both nodes already running) is
logged as an error and left to the operator: a node id must stay stable while the node runs.
mDNS cannot reveal a clone (libp2p's mDNS ignores records that carry our own peer id), so
clones found only by mDNS stay apart without being reported.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from loguru import logger

from exo_core.plugin.transport import (
    PayloadTooLarge,
    PeerConnected,
    PeerDisconnected,
    RequestFailed,
    RequestHandler,
    Transport,
    TransportError,
    TransportEvent,
    TransportLagged,
    TransportMessage,
    network_key,
)
from exo_transport_libp2p import _native

KEY_FILE = "libp2p_identity.key"
EVENT_BATCH = 256
CONTROL_BATCH = 64

# Nodes left running at exit are stopped before the interpreter finalizes: the native side
# takes the GIL from its own threads to complete awaitables, which must not happen later.
atexit.register(_native.shutdown_all)


class Libp2pTransport(Transport):
    """A libp2p node. See the module docstring for its guarantees."""

    def __init__(
        self,
        data_dir: Path | str,
        namespace: str,
        listen_host: str = "0.0.0.0",
        port: int = 0,
        bootstrap_peers: Sequence[str] = (),
        mdns: bool = True,
        *,
        cluster_key: str | None = None,
        max_broadcast_size: int = 1 << 20,
        max_request_size: int = 64 << 20,
        inbox_capacity: int = 8192,
        check_identity: bool = True,
        bootstrap_wait: float = 2.0,
    ) -> None:
        self.key_path = Path(data_dir) / KEY_FILE
        self.namespace = namespace
        self.network_key = network_key(namespace, cluster_key)
        self.listen_host = listen_host
        self.port = port
        self.bootstrap_peers = list(bootstrap_peers)
        self.mdns = mdns
        self.max_broadcast_size = max_broadcast_size
        self.max_request_size = max_request_size
        self.inbox_capacity = inbox_capacity
        self.key_path.parent.mkdir(parents=True, exist_ok=True)
        self._node_id = _native.load_or_create_key(self.key_path)
        self.identity_regenerated = False
        """True when the constructor found a clone of our key and switched to a fresh one."""
        if check_identity and self.bootstrap_peers:
            self._replace_cloned_identity(bootstrap_wait)
        self._node: _native.Node | None = None
        self._handler: RequestHandler | None = None
        self._control_task: asyncio.Task[None] | None = None
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._started = asyncio.Event()
        self._stopped = False
        self.identity_conflicts: list[str] = []
        """Addresses where a running peer presented our own identity after `start()`."""

    # -- identity and addresses -----------------------------------------------------------

    def _replace_cloned_identity(self, timeout: float) -> None:
        try:
            clones = _native.find_identity_clones(
                self.key_path, self.network_key, self.bootstrap_peers, timeout
            )
        except _native.NativeError as e:
            raise TransportError(str(e)) from e
        if clones:
            old = self._node_id
            self._node_id = _native.regenerate_key(self.key_path)
            self.identity_regenerated = True
            logger.warning(
                f"the node at {', '.join(clones)} runs with this node's identity {old} "
                f"(a copied data directory?); this node takes the new identity {self._node_id}"
            )

    @property
    def node_id(self) -> str:
        return self._node_id

    def listen_addrs(self) -> list[str]:
        """Where this node listens, as multiaddrs ending in `/p2p/<node id>` (for bootstraps)."""
        return self._node.listen_addrs() if self._node is not None else []

    def add_bootstrap_peer(self, addr: str) -> None:
        """Dial `addr` now and whenever it is disconnected."""
        self._require_node().add_bootstrap_peer(addr)

    def dropped_total(self) -> int:
        """Inbound broadcasts dropped so far because this node read too slowly."""
        return self._node.dropped_total() if self._node is not None else 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._node is not None or self._stopped:
            raise TransportError("a Libp2pTransport starts once")
        node = await self._start_native()
        self._node = node
        self._control_task = asyncio.create_task(self._control_loop(node))
        self._started.set()
        logger.info(f"libp2p node {self._node_id} listening on {', '.join(node.listen_addrs())}")

    async def _start_native(self) -> _native.Node:
        try:
            return await _native.start_node(
                self.key_path,
                self.network_key,
                listen_host=self.listen_host,
                port=self.port,
                bootstrap_peers=self.bootstrap_peers,
                mdns=self.mdns,
                max_broadcast_size=self.max_broadcast_size,
                max_request_size=self.max_request_size,
                inbox_capacity=self.inbox_capacity,
            )
        except _native.NativeError as e:
            raise TransportError(str(e)) from e

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._started.set()  # wake an `events()` waiting for a start that never came
        if self._node is not None:
            await self._node.stop()
        # The control loop ends by itself once the node's queues close; waiting for that
        # (rather than cancelling it) leaves no native awaitable pending behind us.
        if self._control_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._control_task, timeout=5)
        for task in list(self._handler_tasks):
            task.cancel()
        for task in list(self._handler_tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _require_node(self) -> _native.Node:
        if self._node is None or self._stopped:
            raise TransportError("the transport is not running")
        return self._node

    # -- broadcast ------------------------------------------------------------------------

    async def subscribe(self, topic: str) -> None:
        try:
            await self._require_node().subscribe(topic)
        except _native.NativeError as e:
            raise TransportError(str(e)) from e

    async def publish(self, topic: str, payload: bytes) -> None:
        node = self._require_node()
        payload = bytes(payload)
        try:
            # Queued without a round trip through the event loop; wait only when the command
            # queue is full.
            if not node.try_publish(topic, payload):
                await node.publish(topic, payload)
        except _native.PayloadTooLargeError as e:
            raise PayloadTooLarge(str(e)) from e
        except _native.NativeError as e:
            raise TransportError(str(e)) from e

    # -- request-response -----------------------------------------------------------------

    async def request(self, peer: str, payload: bytes, timeout: float = 10.0) -> bytes:
        node = self._node
        if node is None or self._stopped:
            raise RequestFailed("the transport is not running")
        try:
            return await node.request(peer, bytes(payload), timeout)
        except _native.PayloadTooLargeError as e:
            raise PayloadTooLarge(str(e)) from e
        except _native.NativeError as e:
            raise RequestFailed(str(e)) from e

    def set_request_handler(self, handler: RequestHandler) -> None:
        self._handler = handler

    async def _answer(self, node: _native.Node, request_id: int, peer: str, payload: bytes) -> None:
        ok, answer = False, b"this node answers no requests"
        handler = self._handler
        try:
            if handler is not None:
                answer, ok = bytes(await handler(peer, payload)), True
        except asyncio.CancelledError:
            answer = b"the node is stopping"
            raise
        except Exception as e:
            logger.warning(f"request handler failed on a request from {peer}: {e!r}")
            answer = f"{type(e).__name__}: {e}".encode()
        finally:
            with contextlib.suppress(_native.NativeError):
                node.respond(request_id, ok, answer)

    # -- what arrives ---------------------------------------------------------------------

    async def _control_loop(self, node: _native.Node) -> None:
        """Serve inbound requests and log notices, whether or not anyone reads `events()`."""
        while (batch := await node.next_control(CONTROL_BATCH)) is not None:
            for item in batch:
                match item:
                    case ("request", int(request_id), str(peer), bytes(payload)):
                        task = asyncio.create_task(self._answer(node, request_id, peer, payload))
                        self._handler_tasks.add(task)
                        task.add_done_callback(self._handler_tasks.discard)
                    case ("duplicate_identity", str(address), bool(dialer)):
                        self._on_duplicate_identity(address, dialer)
                    case ("notice", str(level), str(message)):
                        logger.log(level, f"libp2p: {message}")
                    case _:
                        logger.error(f"libp2p: unexpected control item {item!r}")

    def _on_duplicate_identity(self, address: str, dialer: bool) -> None:
        if dialer:
            self.identity_conflicts.append(address)
            logger.error(
                f"the peer at {address} uses this node's identity {self._node_id}; both nodes are "
                f"running, so neither changes it now: restart one of them after deleting its "
                f"{KEY_FILE}"
            )
        else:
            logger.warning(
                f"a peer from {address} presented this node's identity {self._node_id} and was "
                "refused; it takes a new identity when it starts"
            )

    async def events(self) -> AsyncIterator[TransportEvent]:
        await self._started.wait()
        node = self._node
        if node is None:
            return
        while (batch := await node.next_events(EVENT_BATCH)) is not None:
            for item in batch:
                event = _to_event(item)
                if event is not None:
                    yield event

    def peers(self) -> frozenset[str]:
        if self._node is None or self._stopped:
            return frozenset()
        return frozenset(self._node.peers())


def _to_event(item: _native.EventTuple) -> TransportEvent | None:
    match item:
        case ("message", str(topic), str(sender), bytes(payload)):
            return TransportMessage(topic, sender, payload)
        case ("connected", str(peer)):
            return PeerConnected(peer)
        case ("disconnected", str(peer)):
            return PeerDisconnected(peer)
        case ("lagged", int(dropped)):
            return TransportLagged(dropped)
        case _:
            logger.error(f"libp2p: unexpected event {item!r}")
            return None
