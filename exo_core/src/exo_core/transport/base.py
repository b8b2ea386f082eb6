"""The contract between the core and a transport plugin.

A transport gives a node two ways to talk:

* **broadcast** on named topics (`publish`), best effort: messages may be lost, duplicated or
  reordered across senders, and a node never receives its own broadcasts;
* **request-response** to one peer (`request`), for point-to-point traffic such as catch-up and
  data-plane payloads, with an explicit error on failure.

Everything that arrives (topic messages, peers coming and going, overflow) comes out of one
ordered async iterator, `events()`. The core keeps ordering per sender on a topic as a goal the
conformance suite checks; correctness never depends on it, because the replicated log carries its
own indices.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec


class TransportError(Exception):
    """A transport operation failed (peer unknown or unreachable, timeout, closed transport)."""


class RequestFailed(TransportError):
    """A request got no answer: the peer is gone, timed out, or its handler raised."""


class PayloadTooLarge(TransportError):
    """A payload exceeds what the chosen channel can carry."""


class TransportMessage(msgspec.Struct, frozen=True, tag=True):
    """A broadcast received on `topic` from `sender`."""

    topic: str
    sender: str
    payload: bytes


class PeerConnected(msgspec.Struct, frozen=True, tag=True):
    """A peer became reachable. Fires once per peer, not once per connection."""

    peer: str


class PeerDisconnected(msgspec.Struct, frozen=True, tag=True):
    """The last connection to a peer closed."""

    peer: str


class TransportLagged(msgspec.Struct, frozen=True, tag=True):
    """The node read too slowly and `dropped` inbound messages were discarded.

    Receivers must treat this as a possible gap (the replicated log then catches up)."""

    dropped: int


TransportEvent = TransportMessage | PeerConnected | PeerDisconnected | TransportLagged
"""Anything a transport delivers: a message, a peer connecting or leaving, or lag."""

RequestHandler = Callable[[str, bytes], Awaitable[bytes]]
"""Answers a request: called with (sender node id, payload), returns the response payload."""


class Transport(abc.ABC):
    """One node's view of the network. A node id is a stable string (the peer id for libp2p)."""

    @property
    @abc.abstractmethod
    def node_id(self) -> str:
        """This node's id."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start listening and connecting. Called once, before any other call."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close every connection; `events()` then ends."""

    @abc.abstractmethod
    async def subscribe(self, topic: str) -> None:
        """Receive broadcasts on `topic` from now on."""

    @abc.abstractmethod
    async def publish(self, topic: str, payload: bytes) -> None:
        """Broadcast `payload` to every peer subscribed to `topic`, best effort.

        Succeeds with no peers (the message is simply not delivered). Raises `PayloadTooLarge`
        when the payload cannot be broadcast; use `request` for large payloads."""

    @abc.abstractmethod
    async def request(self, peer: str, payload: bytes, timeout: float = 10.0) -> bytes:
        """Send `payload` to `peer` and return its handler's answer.

        Raises `RequestFailed` when the peer is unknown, unreachable, times out or fails."""

    @abc.abstractmethod
    def set_request_handler(self, handler: RequestHandler) -> None:
        """Install the function that answers inbound requests (one per node)."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[TransportEvent]:
        """Everything that arrives, in arrival order. One consumer per transport."""

    @abc.abstractmethod
    def peers(self) -> frozenset[str]:
        """The peers currently connected."""
