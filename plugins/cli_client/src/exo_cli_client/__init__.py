"""`exo` subcommands that talk to a running node over its HTTP API (run, ps, models, pull, rm,
nodes, place)."""

DEFAULT_NODE = "http://127.0.0.1:52415"  # a node's API at its default address
