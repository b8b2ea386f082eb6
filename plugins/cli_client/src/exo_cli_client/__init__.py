"""`exo` subcommands that talk to a running node over its HTTP API (run, ps, models, pull, rm,
nodes, place)."""
