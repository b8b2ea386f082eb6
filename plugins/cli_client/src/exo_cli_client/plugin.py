"""Hook implementations of the cli_client plugin: the subcommands that drive a running node."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

from exo_cli_client import DEFAULT_NODE
from exo_core.plugin import hookimpl

# Every `exo` process loads this plugin, a node included: the client (httpx, rich) is imported
# only when one of these subcommands runs, not into a node that never uses it.
if TYPE_CHECKING:
    from exo_cli_client.client import NodeClient
    from exo_cli_client.output import Output

    Command = Callable[[argparse.Namespace, NodeClient, Output], int]


def _client_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--node", default=os.environ.get("EXO_NODE", DEFAULT_NODE),
        help=f"the node's API URL (default: $EXO_NODE or {DEFAULT_NODE})")  # fmt: skip
    add("--api-key", default=os.environ.get("EXO_API_KEY"),
        help="the node's API key (default: $EXO_API_KEY), sent as a Bearer token")  # fmt: skip
    add("--json", action="store_true", help="print the API's JSON")


def _runs(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The subcommand `exo_cli_client.<module>.<name>`, imported when it runs."""

    def main(args: argparse.Namespace) -> int:
        from exo_cli_client.client import EXIT_INTERRUPTED, ClientError, NodeClient
        from exo_cli_client.output import Output

        command: Command = getattr(import_module(f"exo_cli_client.{module}"), name)
        out = Output(as_json=args.json)
        client = NodeClient(args.node, args.api_key)
        try:
            return command(args, client, out)
        except ClientError as e:
            out.error(e.message)
            return e.exit_code
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        finally:
            client.close()

    return main


@hookimpl
def exo_cli_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    def command(name: str, help: str, run: str) -> argparse.ArgumentParser:
        parser = subparsers.add_parser(name, help=help)
        _client_options(parser)
        module, function = run.split(".")
        parser.set_defaults(func=_runs(module, function))
        return parser

    p = command("run", "chat with a model (places it first if needed)", "chat.run")
    p.add_argument("model")
    p.add_argument("prompt", nargs="*", help="answer this prompt and exit")
    p.add_argument("--max-tokens", type=int, default=None)
    command("ps", "instances, where they run, their runners", "commands.ps")
    p = command("models", "known models, where they are downloaded", "commands.models")
    p.add_argument("--downloaded", action="store_true", help="only downloaded models")
    p = command("pull", "download a model to the node", "commands.pull")
    p.add_argument("model")
    p = command("rm", "delete a model's files from the node", "commands.rm")
    p.add_argument("model")
    command("nodes", "the cluster's nodes, master, memory and links", "commands.nodes")
    p = command("place", "show placements of a model, then place it", "commands.place")
    p.add_argument("model")
    p.add_argument("--sharding", choices=["pipeline", "tensor"], default=None)
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--no-wait", action="store_true", help="do not wait for the runners")
