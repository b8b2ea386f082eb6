"""Hook implementations of the transport_libp2p plugin."""
