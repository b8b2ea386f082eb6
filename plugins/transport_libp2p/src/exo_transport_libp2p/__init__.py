"""exo plugin transport_libp2p: the node transport over rust-libp2p."""

from exo_transport_libp2p.transport import Libp2pTransport

__all__ = ["Libp2pTransport"]
