"""exo's web dashboard: one page at `/` with static ES modules, served by the node's API."""
