"""exo plugin transport_libp2p."""
