"""The libp2p transport passes the core's transport conformance suite.

`transport_cluster` comes from this folder's conftest: nodes on 127.0.0.1, mDNS off, joined by
bootstrap addresses."""

from exo_core.testing.transport_conformance import *  # noqa: F403  # pyright: ignore[reportWildcardImportFromLibrary]
