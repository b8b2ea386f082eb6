"""Hook implementations of the transport_libp2p plugin."""

from __future__ import annotations

from exo_core.config import NodeConfig
from exo_core.hookspecs import hookimpl
from exo_core.transport.base import Transport
from exo_transport_libp2p.transport import Libp2pTransport

# The names under which `config.transport` selects this plugin's transport.
NAMES = frozenset({"libp2p", "transport_libp2p"})


@hookimpl
def exo_transport(config: NodeConfig) -> Transport | None:
    """The libp2p transport, unless the configuration asks for another one."""
    if config.transport and config.transport not in NAMES:
        return None
    return Libp2pTransport(
        data_dir=config.data_path,
        namespace=config.namespace,
        listen_host=config.listen_host,
        port=config.libp2p_port,
        bootstrap_peers=config.bootstrap_peers,
        mdns=config.mdns,
        cluster_key=config.cluster_key,
    )
