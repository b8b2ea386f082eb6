"""A node's configuration, built from the command line and environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import platformdirs


def default_data_dir() -> str:
    """`$EXO_HOME`, else the XDG data directory (`~/.local/share/exo` on Linux)."""
    return os.environ.get("EXO_HOME") or platformdirs.user_data_dir("exo", appauthor=False)


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where exo keeps files it can rebuild: `$EXO_CACHE_DIR`, else `$XDG_CACHE_HOME/exo`
    (`~/.cache/exo`)."""
    env = os.environ if env is None else env
    base = env.get("EXO_CACHE_DIR") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "exo"
    )
    return Path(base)


class NodeConfig(msgspec.Struct, kw_only=True):
    """A node's configuration, from the command line and the environment."""

    api_host: str = "127.0.0.1"
    api_port: int = 52415
    data_dir: str = msgspec.field(default_factory=default_data_dir)
    api: bool = True
    worker: bool = True
    force_master: bool = False
    namespace: str = "default"
    # The cluster key this node runs with (see `exo_core.cluster_key`); None: the network is
    # keyed by the namespace alone, so anyone who reaches it can join.
    cluster_key: str | None = None
    offline: bool = False
    bootstrap_peers: list[str] = msgspec.field(default_factory=list)
    listen_host: str = "0.0.0.0"
    auto_place: bool = True
    # Models whose own Python code (trust_remote_code) this node runs: its operator's choice,
    # never a card's from the cluster (see exo_core.trust).
    trust_remote_code: list[str] = msgspec.field(default_factory=list)
    # Nodes never given a model when this node places one (as master, or through its API).
    exclude_nodes: list[str] = msgspec.field(default_factory=list)
    # A model to place an instance of once the node is up (`-m/--model`); None for none.
    start_model: str | None = None
    # False (`--no-downloads`): this node fetches no model; only those on disk run here.
    downloads: bool = True
    # False (`--no-batch`): engines serve one request at a time, without continuous batching.
    batch: bool = True
    # The most memory this node offers placement, in bytes (None: what the machine has free).
    max_memory: int | None = None
    # Seconds without output before a stream sends its dialect's keep-alive.
    keepalive_s: float = 10.0
    # Events between snapshots of state; the log is cut behind each snapshot.
    snapshot_every: int = 10_000
    verbosity: int = 0
    disabled_plugins: list[str] = msgspec.field(default_factory=list)
    # The transport to use: a plugin's name, "memory" for the in-process one, or "" for the
    # first plugin that offers one.
    transport: str = ""
    # HTTP access (see exo_core.api.security): the API key ("" for none), the web origins
    # allowed to call the API (CORS), and host names accepted besides the built-in ones.
    api_key: str = ""
    cors_origins: list[str] = msgspec.field(default_factory=list)
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    # The most API connections held at once (lowered to fit the open-file limit); those
    # beyond it are refused with a 503 (see exo_core.api.connections).
    max_connections: int = 1000
    # Options that plugins added to the command line, by argparse dest.
    plugin_options: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def models_dir(self) -> Path:
        return self.data_path / "models"


def model_roots(config: NodeConfig, env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """Every directory this node keeps or finds models in: its own (first), then
    `EXO_MODELS_DIRS` and `EXO_MODELS_READ_ONLY_DIRS` (colon-separated, as the downloader
    reads them)."""
    env = os.environ if env is None else env
    extra = [
        Path(p).expanduser()
        for name in ("EXO_MODELS_DIRS", "EXO_MODELS_READ_ONLY_DIRS")
        for p in env.get(name, "").split(os.pathsep)
        if p.strip()
    ]
    return (config.models_dir, *extra)
