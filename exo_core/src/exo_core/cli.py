"""The `exo` command: start a node, list plugins, and plugins' own subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
from loguru import logger

from exo_core import cluster_key, scaffold
from exo_core.config import NodeConfig, default_data_dir
from exo_core.datadir import DataDirInUse, DataDirLock
from exo_core.logs import setup_logging
from exo_core.plugin_host import Call, PluginHost, describe, load_plugins
from exo_core.telemetry import parse_size


def _peers(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def _size(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_http_options(parser: argparse.ArgumentParser) -> None:
    """Who may use the HTTP API (see exo_core.api.security)."""
    http = parser.add_argument_group("HTTP access")
    http.add_argument("--api-key", default=os.environ.get("EXO_API_KEY", ""),
        help="require this key (Authorization: Bearer or x-api-key) on every route but /healthz")  # fmt: skip
    http.add_argument("--cors-origin", action="append", default=_peers(os.environ.get("EXO_CORS_ORIGINS", "")),
        metavar="ORIGIN", help="a web origin allowed to call the API (repeatable; CORS is off by default)")  # fmt: skip
    http.add_argument("--allowed-host", action="append", default=_peers(os.environ.get("EXO_ALLOWED_HOSTS", "")),
        metavar="NAME", help="a host name the API answers to besides IPs, localhost and this machine's name")  # fmt: skip
    http.add_argument("--max-connections", type=int, default=1000, metavar="N",
        help="the most API connections held at once (lowered to fit the open-file limit); more are refused with 503")  # fmt: skip


def core_parser() -> argparse.ArgumentParser:
    """The `exo` command line with only the core's own options (plugins add theirs)."""
    parser = argparse.ArgumentParser(
        prog="exo", description="Run an exo node: join this machine to an AI cluster."
    )
    add = parser.add_argument
    add("--api-host", default="127.0.0.1", help="address the HTTP API listens on")
    add("--api-port", type=int, default=52415, help="port of the HTTP API")
    add("--data-dir", default=default_data_dir(), help="where the node keeps its log and models")
    add("-v", "--verbose", action="count", default=0, help="more logging")
    add("-q", "--quiet", action="count", default=0, help="less logging")
    add("--no-api", action="store_true", help="serve no HTTP API")
    add("--no-worker", action="store_true", help="run no models on this node")
    add("-m", "--model", default=None, metavar="MODEL",
        help="place an instance of MODEL once the node is up (unless one is running already)")  # fmt: skip
    add("--no-downloads", action="store_true",
        help="download no models on this node: only models already on disk run here")  # fmt: skip
    add("--no-batch", action="store_true",
        help="serve one request at a time per model (no continuous batching)")  # fmt: skip
    add("--force-master", action="store_true", help="win every master election")
    add("--namespace", default=os.environ.get("EXO_NAMESPACE", "default"),
        help="only nodes with the same namespace form a cluster")  # fmt: skip
    add("--cluster-key", default=os.environ.get(cluster_key.ENV_VAR), metavar="KEY",
        help="the secret every node of the cluster shares (also EXO_CLUSTER_KEY); saved in the "
        "data directory. Default: the saved key, else a new one (printed at start-up) unless "
        "the transport listens on loopback only")  # fmt: skip
    add("--no-cluster-key", action="store_true",
        help="run an open cluster: ANY machine that reaches the port can join")  # fmt: skip
    add("--offline", action="store_true", help="use only models already on disk")
    add("--bootstrap-peers", type=_peers, default=_peers(os.environ.get("EXO_BOOTSTRAP_PEERS", "")),
        help="comma-separated addresses of peers to connect to")  # fmt: skip
    add("--listen-host", default="0.0.0.0", help="address the node transport listens on")
    add("--max-memory", type=_size, default=os.environ.get("EXO_MAX_MEMORY") or None, metavar="SIZE",
        help="offer placement at most this much memory (e.g. 600MB, 8GiB; also EXO_MAX_MEMORY): "
        "the node reports it as its total, less its runners' memory as free")  # fmt: skip
    add("--no-auto-place", action="store_true",
        help="do not place a model automatically when a request names it")  # fmt: skip
    add("--trust-remote-code", action="append", default=[], metavar="MODEL",
        help="run this model's own Python code (repeatable); no card from the cluster can")  # fmt: skip
    add("--exclude-node", action="append", default=_peers(os.environ.get("EXO_EXCLUDE_NODES", "")),
        metavar="NODE_ID", help="never place a model on this node (repeatable; also EXO_EXCLUDE_NODES)")  # fmt: skip
    add("--transport", default="", help="transport plugin to use ('memory': run alone)")
    add("--disable-plugin", action="append", default=[], metavar="NAME",
        help="leave a plugin out (repeatable); see `exo plugins`")  # fmt: skip
    _add_http_options(parser)
    return parser


def core_dests() -> set[str]:
    """The argparse dests of the core's options: every other dest belongs to a plugin."""
    return {a.dest for a in core_parser()._actions} | {"command", "func"}  # pyright: ignore[reportPrivateUsage]


def build_parser(plugins: PluginHost) -> argparse.ArgumentParser:
    parser = core_parser()
    accepted: list[Call] = []
    for name, add_options in plugins.implementations("exo_add_cli_options"):
        # Tried on a fresh parser first: argparse keeps the options added before a conflict.
        trial = core_parser()
        for earlier in accepted:
            earlier(parser=trial)
        ok, _ = plugins.attempt(
            name, "exo_add_cli_options", add_options, leave_out=True, parser=trial
        )
        if ok:
            add_options(parser=parser)
            accepted.append(add_options)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = sub.add_parser("plugins", help="list the plugins: loaded, disabled and failed")
    listing.set_defaults(func=lambda args: _list_plugins(plugins, config_from_args(args)))
    scaffold.add_command(sub)
    for name, add_commands in plugins.implementations("exo_cli_commands"):
        trial = argparse.ArgumentParser().add_subparsers()
        for taken in sub.choices:
            trial.add_parser(taken)
        ok, _ = plugins.attempt(
            name, "exo_cli_commands", add_commands, leave_out=True, subparsers=trial
        )
        if ok:
            add_commands(subparsers=sub)
    return parser


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    return NodeConfig(
        api_host=args.api_host,
        api_port=args.api_port,
        data_dir=str(Path(args.data_dir).expanduser()),
        api=not args.no_api,
        worker=not args.no_worker,
        force_master=args.force_master,
        namespace=args.namespace,
        offline=args.offline or os.environ.get("EXO_OFFLINE", "") not in ("", "0"),
        bootstrap_peers=args.bootstrap_peers,
        listen_host=args.listen_host,
        auto_place=not args.no_auto_place,
        trust_remote_code=args.trust_remote_code,
        exclude_nodes=args.exclude_node,
        start_model=args.model,
        downloads=not args.no_downloads,
        batch=not args.no_batch,
        max_memory=args.max_memory,
        verbosity=args.verbose - args.quiet,
        disabled_plugins=args.disable_plugin,
        transport=args.transport,
        api_key=args.api_key,
        cors_origins=args.cors_origin,
        allowed_hosts=args.allowed_host,
        max_connections=args.max_connections,
        plugin_options={k: v for k, v in vars(args).items() if k not in core_dests()},
    )


def with_cluster_key(config: NodeConfig, given: str | None, open_network: bool) -> NodeConfig:
    """The configuration with the cluster key resolved (and announced) for a networked node."""
    if config.transport == "memory":
        return config
    key = cluster_key.resolve(config.data_path, config.listen_host, given, open_network)
    cluster_key.announce(key, config.data_path)
    return msgspec.structs.replace(config, cluster_key=key.secret)


def _list_plugins(plugins: PluginHost, config: NodeConfig) -> int:
    from exo_core.plugin_check import run_startup_hooks

    # The start-up hooks a node would call, so that this listing agrees with `GET /plugins`;
    # their failures are listed below rather than logged.
    logger.disable("exo_core")
    try:
        run_startup_hooks(plugins, config)
    finally:
        logger.enable("exo_core")
    for info in plugins.plugins():
        print(f"{info.name:<20} {info.distribution} {info.version}  hooks: {', '.join(info.hooks)}")
    for name in plugins.disabled:
        print(f"{name:<20} DISABLED (--disable-plugin)")
    for failure in plugins.failures:
        where = "FAILED TO LOAD" if failure.hook == "load" else f"FAILED in {failure.hook}"
        print(f"{failure.name:<20} {where}: {failure.error}")
    for warning in plugins.warnings:
        print(f"warning: {warning}")
    return 0


def _disabled_from(argv: Sequence[str]) -> list[str]:
    """`--disable-plugin` must be known before the parser exists (plugins add options to it)."""
    names, it = [], iter(argv)
    for arg in it:
        if arg == "--disable-plugin":
            names.append(next(it, ""))
        elif arg.startswith("--disable-plugin="):
            names.append(arg.split("=", 1)[1])
    return [n for n in names if n]


def _replay(held: list[Any]) -> None:
    for message in held:
        record = message.record
        logger.opt(exception=record["exception"]).log(record["level"].name, record["message"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Loading reports plugin failures before logging is set up (the parser needs the plugins):
    # hold the records, then emit each once where logging goes.
    held: list[Any] = []
    logger.remove()
    holding = logger.add(held.append, level="INFO", format="{message}")
    plugins = load_plugins(disabled=_disabled_from(argv))
    args = build_parser(plugins).parse_args(argv)
    logger.remove(holding)
    if args.command:
        logger.add(sys.stderr, level="WARNING")
        if args.command != "plugins":  # the listing shows them itself
            _replay(held)
        return int(args.func(args) or 0)
    config = config_from_args(args)
    try:
        # First of all, before logs, the event log or any runner: one exo per data directory.
        lock = DataDirLock(config.data_path)
    except DataDirInUse as e:
        print(f"exo: {e}", file=sys.stderr)
        return 1
    setup_logging(config.verbosity, config.data_path)
    try:
        config = with_cluster_key(config, args.cluster_key, args.no_cluster_key)
    except cluster_key.ClusterKeyError as e:
        _replay(held)
        logger.error(f"exo cannot start: {e}")
        return 2
    _replay(held)
    from exo_core.server import run_node

    try:
        anyio.run(run_node, config, plugins, lock)
    except KeyboardInterrupt:
        pass
    except Exception as e:
        logger.opt(exception=e).error(f"exo stopped: {describe(e)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
