"""The node's HTTP API: the Litestar app host and the native routes."""
