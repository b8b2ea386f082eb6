"""For transport plugins: the transport protocol, its events and errors, and the key a
cluster's nodes share."""

from __future__ import annotations

from exo_core.cluster_key import network_key
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
    "network_key",
]
