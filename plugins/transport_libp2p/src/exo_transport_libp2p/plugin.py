"""Hook implementations of the transport_libp2p plugin."""

from __future__ import annotations

import argparse

from exo_core.plugin import NodeConfig, hookimpl
from exo_core.plugin.transport import Transport
from exo_transport_libp2p.transport import Libp2pTransport

# The names under which `config.transport` selects this plugin's transport.
NAMES = frozenset({"libp2p", "transport_libp2p"})


@hookimpl
def exo_add_cli_options(parser: argparse.ArgumentParser) -> None:
    """The transport's own options; they reach `exo_transport` in `config.plugin_options`."""
    parser.add_argument(
        "--libp2p-port", type=int, default=0, help="fixed port for the libp2p transport (0: any)"
    )
    parser.add_argument(
        "--no-mdns", action="store_true", help="do not discover peers on the local network"
    )


@hookimpl
def exo_transport(config: NodeConfig) -> Transport | None:
    """The libp2p transport, unless the configuration asks for another one."""
    if config.transport and config.transport not in NAMES:
        return None
    return Libp2pTransport(
        data_dir=config.data_path,
        namespace=config.namespace,
        listen_host=config.listen_host,
        port=int(config.plugin_options.get("libp2p_port", 0)),
        bootstrap_peers=config.bootstrap_peers,
        mdns=not config.plugin_options.get("no_mdns", False),
        cluster_key=config.cluster_key,
    )
