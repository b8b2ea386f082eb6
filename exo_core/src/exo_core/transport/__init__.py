"""The transport interface every node talks through, and the in-memory transport."""

from exo_core.transport.base import (
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
)

__all__ = [
    "PayloadTooLarge",
    "PeerConnected",
    "PeerDisconnected",
    "RequestFailed",
    "RequestHandler",
    "Transport",
    "TransportError",
    "TransportEvent",
    "TransportLagged",
    "TransportMessage",
]
